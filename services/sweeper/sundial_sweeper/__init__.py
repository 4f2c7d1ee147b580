"""sundial_sweeper."""
