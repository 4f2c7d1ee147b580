"""How a Sundial process runs: settings, the one clock, stop signals, logging, the service loop driver."""
