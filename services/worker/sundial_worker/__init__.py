"""sundial_worker."""
