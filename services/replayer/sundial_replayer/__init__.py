"""sundial_replayer: replays of a pool's Kafka messages into a staging pool."""
