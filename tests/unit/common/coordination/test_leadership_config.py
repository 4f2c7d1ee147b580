"""LeadershipConfig refuses settings under which the trust window would be a lie, and says why."""

from __future__ import annotations

import dataclasses

import pytest
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership


def test_defaults_give_a_five_second_lease_renewed_three_times_per_ttl() -> None:
    config = LeadershipConfig()
    assert (config.ttl_sec, config.margin_sec, config.key_prefix) == (5.0, 1.0, "/sundial/shards/")
    assert config.renew_interval_sec == pytest.approx(5.0 / 3)
    assert config.trust_window_sec == 4.0
    assert config.leader_key(12) == "/sundial/shards/12/leader"


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        LeadershipConfig().ttl_sec = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl_sec": 1.0}, r"ttl_sec must be at least 2.0 seconds .*got 1.0"),
        ({"ttl_sec": 0}, r"ttl_sec must be at least 2.0"),
        ({"ttl_sec": float("nan")}, r"ttl_sec must be a finite number of seconds, got nan"),
        ({"ttl_sec": "5"}, r"ttl_sec must be a finite number of seconds, got '5'"),
        ({"ttl_sec": True}, r"ttl_sec must be a finite number"),
        ({"margin_sec": 0.0}, r"margin_sec must be > 0"),
        ({"margin_sec": -1.0}, r"margin_sec must be > 0"),
        ({"margin_sec": float("inf")}, r"margin_sec must be a finite number"),
        # ttl 5 renews every 1.67 s: a 4 s margin leaves a 1 s window, so trust would lapse before renewal.
        ({"margin_sec": 4.0}, r"trust window of 1.00 s, not longer than the renewal interval .*1.67 s.*< 3.33"),
        ({"ttl_sec": 2.0, "margin_sec": 1.5}, r"trust window of 0.50 s"),
        ({"key_prefix": "sundial/shards/"}, r"key_prefix must be a string starting with '/'"),
        ({"key_prefix": "/sundial/shards"}, r"must end with '/'.*did you mean '/sundial/shards/'\?"),
    ],
)
def test_invalid_settings_are_refused_with_a_helpful_message(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeadershipConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl_sec": 2.0, "margin_sec": 0.5},  # what the integration tests use
        {"ttl_sec": 2, "margin_sec": 1},  # ints are seconds too
        {"ttl_sec": 30.0, "margin_sec": 5.0, "key_prefix": "/tenant-a/sundial/"},
    ],
)
def test_sensible_settings_are_accepted(kwargs: dict[str, object]) -> None:
    LeadershipConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shard", "holder", "message"),
    [(-1, "a", "shard must be a non-negative integer"), (0, "", "holder must be a non-empty id")],
)
def test_shard_and_holder_are_validated_at_construction(shard: int, holder: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardLeadership(client=object(), shard=shard, holder=holder)
