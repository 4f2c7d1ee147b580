"""Sundial analytics: the ClickHouse replica of executions and the history queries answered from it."""
