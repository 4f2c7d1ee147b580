"""sundial_dispatcher."""
