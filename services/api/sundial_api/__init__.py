"""sundial_api."""
