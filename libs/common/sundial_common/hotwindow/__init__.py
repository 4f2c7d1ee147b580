"""Redis: the hot window of due occurrences, per-execution signals and rate-limit buckets."""
