"""Domain rules: pure functions and values (schedules, retry policy, ids); no I/O, nothing else of Sundial's."""
