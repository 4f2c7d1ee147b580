"""Kafka: topics, the execution message codec, the publisher, consumer wake-ups and topic windows."""
