"""sundial_common."""
