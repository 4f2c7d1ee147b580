"""The key store's contract: the first master key recorded wins, data keys are added once and only under a
known master key, and a rotation moves every key before it finishes."""

from __future__ import annotations

from tests.contracts.registries import Registries

OLD, NEW, OTHER = "check-old", "check-new", "check-other"


async def test_the_first_master_key_recorded_is_the_one_kept(registries: Registries) -> None:
    keys = registries.keys
    assert await keys.master_check_values() == (None, None)
    await keys.record_master_check_value(OLD)
    await keys.record_master_check_value(NEW)
    assert await keys.master_check_values() == (OLD, None)


async def test_a_data_key_is_added_once_and_only_under_the_recorded_master_key(registries: Registries) -> None:
    keys = registries.keys
    assert not await keys.add_data_key("acme", b"wrapped-1", OLD), "no master key recorded yet"
    await keys.record_master_check_value(OLD)
    assert not await keys.add_data_key("acme", b"wrapped-1", OTHER), "another master key's: nobody could unwrap it"
    assert await keys.add_data_key("acme", b"wrapped-1", OLD)
    assert not await keys.add_data_key("acme", b"wrapped-2", OLD), "a tenant has one data key"
    assert await keys.wrapped_data_keys(["acme", "globex"]) == {"acme": (b"wrapped-1", OLD)}
    assert await keys.wrapped_data_keys([]) == {}


async def test_a_rotation_rewraps_every_key_before_it_finishes(registries: Registries) -> None:
    keys = registries.keys
    await keys.record_master_check_value(OLD)
    for tenant in ("c", "a", "b"):
        assert await keys.add_data_key(tenant, f"old-{tenant}".encode(), OLD)

    assert not await keys.begin_rotation(NEW, OTHER), "only from the recorded key"
    assert await keys.begin_rotation(OLD, NEW)
    assert await keys.begin_rotation(OLD, NEW), "resuming the same rotation is fine"
    assert not await keys.begin_rotation(OLD, OTHER), "another target is not"
    assert await keys.master_check_values() == (OLD, NEW)
    assert await keys.add_data_key("d", b"new-d", NEW), "a key under the target is known during the rotation"

    assert await keys.count_data_keys(OLD) == (3, 4)
    assert await keys.data_keys_to_rewrap(OLD, 2) == [("a", b"old-a"), ("b", b"old-b")]
    assert not await keys.finish_rotation(OLD, NEW), "keys are left under the old master key"

    assert await keys.rewrap_data_keys([("a", b"new-a"), ("b", b"new-b"), ("d", b"again-d")], OLD, NEW) == 2
    assert await keys.wrapped_data_keys(["d"]) == {"d": (b"new-d", NEW)}, "a key not under the old one is left"
    assert await keys.rewrap_data_keys([("c", b"new-c")], OLD, NEW) == 1
    assert await keys.count_data_keys(OLD) == (0, 4)
    assert await keys.data_keys_to_rewrap(OLD, 10) == []

    assert not await keys.finish_rotation(OLD, OTHER), "not the rotation under way"
    assert await keys.finish_rotation(OLD, NEW)
    assert await keys.master_check_values() == (NEW, None)
    assert await keys.wrapped_data_keys(["a", "c"]) == {"a": (b"new-a", NEW), "c": (b"new-c", NEW)}
