"""sundial_hydrator."""
