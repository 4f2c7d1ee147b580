"""Background loops validate their configuration where it is built."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sundial_dispatcher.dispatcher import DispatcherConfig
from sundial_hydrator.hydrator import HydratorConfig
from sundial_sweeper.partitions import PartitionLoopConfig
from sundial_sweeper.sweeper import SweeperConfig


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (HydratorConfig, {"shards": 0}, "shards"),
        (HydratorConfig, {"hot_window_sec": 5}, "hot_window_sec"),
        (HydratorConfig, {"batch_size": 0}, "batch_size"),
        (DispatcherConfig, {"batch_size": 0}, "batch_size"),
        (DispatcherConfig, {"poll_interval_sec": 0}, "poll_interval_sec"),
        (SweeperConfig, {"interval_sec": 0}, "interval"),
        (PartitionLoopConfig, {"retention_days": -1}, "retention_days"),
        (PartitionLoopConfig, {"ahead_days": 0}, "ahead_days"),
        (PartitionLoopConfig, {"interval_sec": 0}, "interval_sec"),
        (PartitionLoopConfig, {"lock_timeout_ms": 0}, "lock_timeout_ms"),
    ],
)
def test_bad_loop_config_is_rejected_with_the_field_named(
    factory: Callable[..., object], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def test_defaults_are_valid() -> None:
    assert HydratorConfig().hot_window_sec == 3600
    assert DispatcherConfig().batch_size == 1000
    assert SweeperConfig().unstarted_after_sec == 60
    assert PartitionLoopConfig().retention_days == 30
