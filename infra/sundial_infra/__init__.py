"""sundial_infra."""
