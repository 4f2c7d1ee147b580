"""The job store's contract: a new job's row as Postgres makes it, the active-jobs quota, compare-and-set state
changes and definitions on ``version``, a manual run pending once, tenant-scoped reads, filtered keyset pages, the
hydrator's scans per shard, and the pruning of jobs that ended."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sundial_common.domain.ids import new_id
from sundial_common.stores.jobs import JobFilter, JobKeyTaken
from sundial_common.stores.tenants import ActiveJobsQuotaExceeded
from sundial_common.stores.types import Occurrence
from sundial_common.testing.jobs import JOB_DEFAULTS

from tests.contracts.jobs import Jobs, ids, later, one_shot

#: The columns a job row has (``jobs.*``), what every read of one hands out.
COLUMNS = {*JOB_DEFAULTS, "id", "tenant_id", "name", "type", "pool", "handler", "timeout_sec", "shard"} | {
    "created_at",
    "updated_at",
}
NOW = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


async def test_a_new_job_reads_back_with_the_columns_postgres_gives_it(jobs: Jobs) -> None:
    due = later(NOW, 60)
    values = one_shot(due, labels={"team": "data"})
    row = await jobs.store.insert_job(values, "alice")
    assert set(row.keys()) == COLUMNS
    assert (row["state"], row["version"], row["fire_count"], row["missed_fires"]) == ("ACTIVE", 1, 0, 0)
    assert (row["next_fire_at"], row["next_nominal_at"], row["labels"]) == (due, due, {"team": "data"})
    assert (row["payload"], row["retry_policy"], row["priority"], row["trigger_at"]) == ({}, {}, "NORMAL", None)
    assert row["created_at"] is not None and row["created_at"] == row["updated_at"]
    values["labels"]["team"] = "ops"  # what was written is the store's own
    assert await jobs.store.get_job("acme", values["id"]) == row
    assert await jobs.store.get_job("globex", values["id"]) is None, "another tenant's job is not found"


async def test_a_job_key_is_unique_per_tenant_and_finds_its_job(jobs: Jobs) -> None:
    store = jobs.store
    keyed = await store.insert_job(one_shot(NOW, key="reports/nightly", key_digest="d1"), "a")
    assert (keyed["key"], keyed["key_digest"]) == ("reports/nightly", "d1")
    with pytest.raises(JobKeyTaken) as taken:
        await store.insert_job(one_shot(NOW, key="reports/nightly", key_digest="d2"), "a")
    assert (taken.value.tenant_id, taken.value.key) == ("acme", "reports/nightly")
    with pytest.raises(JobKeyTaken):  # a batch holding a taken key writes nothing
        await store.insert_jobs([one_shot(NOW), one_shot(NOW, key="reports/nightly")], "a")
    theirs = await store.insert_job(one_shot(NOW, tenant="globex", key="reports/nightly"), "a")
    await store.insert_job(one_shot(NOW), "a")  # jobs without a key never clash
    await store.insert_job(one_shot(NOW), "a")
    found = await store.get_job_by_key("acme", "reports/nightly")
    assert found is not None and found["id"] == keyed["id"]
    assert await store.get_job_by_key("acme", "nope") is None
    assert ids(await store.list_jobs("acme", JobFilter(key="reports/nightly"), None, 10)) == [keyed["id"]]
    assert ids(await store.list_jobs("globex", JobFilter(key="reports/nightly"), None, 10)) == [theirs["id"]]
    assert len(await store.list_jobs("acme", JobFilter(), None, 10)) == 3


async def test_the_active_jobs_quota_counts_jobs_that_can_still_fire(jobs: Jobs) -> None:
    first = await jobs.store.insert_job(one_shot(NOW), "a", max_active_jobs=2)
    await jobs.store.insert_job(one_shot(NOW), "a", max_active_jobs=2)
    with pytest.raises(ActiveJobsQuotaExceeded) as refused:
        await jobs.store.insert_job(one_shot(NOW), "a", max_active_jobs=2)
    assert (refused.value.limit, refused.value.current) == (2, 2)
    assert await jobs.store.cancel_job("acme", first["id"], "a") is not None
    batch = [one_shot(NOW) for _ in range(3)]
    assert ids(await jobs.store.insert_jobs(batch, "a", max_active_jobs=2)) == [batch[0]["id"]], "only what fits"
    assert await jobs.store.count_tenant_jobs("acme") == {"ACTIVE": 2, "CANCELLED": 1}


async def test_state_changes_are_compare_and_sets_that_move_the_version(jobs: Jobs) -> None:
    store = jobs.store
    job = await store.insert_job(one_shot(later(NOW, 60)), "a")
    paused = await store.pause_job("acme", job["id"], "a")
    assert paused is not None and (paused["state"], paused["version"]) == ("PAUSED", 2)
    assert await store.pause_job("acme", job["id"], "a") is None, "only an ACTIVE job pauses"
    assert await store.resume_job("globex", job["id"], "a") is None, "nor another tenant's"
    resumed = await store.resume_job("acme", job["id"], "a")
    assert resumed is not None and (resumed["state"], resumed["version"]) == ("ACTIVE", 3)

    renamed = await store.update_job(resumed, {**resumed, "name": "renamed", "priority": "HIGH"}, "a", {})
    assert renamed is not None and (renamed["name"], renamed["priority"], renamed["version"]) == ("renamed", "HIGH", 4)
    assert await store.update_job(resumed, {**resumed, "name": "late"}, "a", {}) is None, "from a version gone"
    assert (await store.get_job("acme", job["id"]) or {})["name"] == "renamed"

    cancelled = await store.cancel_job("acme", job["id"], "a")
    assert cancelled is not None and (cancelled["state"], cancelled["next_fire_at"]) == ("CANCELLED", None)
    assert await store.cancel_job("acme", job["id"], "a") is None

    fired = await store.insert_job(one_shot(None, state="PAUSED"), "a")  # paused with no occurrence left
    done = await store.resume_job("acme", fired["id"], "a")
    assert done is not None and done["state"] == "COMPLETED"


async def test_a_manual_run_is_pending_once_until_its_execution_is_made(jobs: Jobs) -> None:
    store = jobs.store
    job = await store.insert_job(one_shot(later(NOW, 600)), "a")
    execution_id = new_id()
    asked = await store.trigger_job("acme", job["id"], NOW, execution_id, "a", "00-trace-01")
    assert asked is not None and (asked["trigger_at"], asked["trigger_execution_id"]) == (NOW, execution_id)
    assert asked["trigger_traceparent"] == "00-trace-01" and asked["version"] == job["version"]
    assert await store.trigger_job("acme", job["id"], NOW, new_id(), "a") is None, "a double click runs once"
    assert ids([await store.pending_trigger("acme", execution_id)]) == [job["id"]]
    assert await store.pending_trigger("globex", execution_id) is None
    assert await store.pending_trigger("acme", new_id()) is None
    await store.cancel_job("acme", job["id"], "a")
    other = await store.insert_job(one_shot(NOW), "a")
    await store.cancel_job("acme", other["id"], "a")
    assert await store.trigger_job("acme", other["id"], NOW, new_id(), "a") is None, "not a cancelled job"


async def test_a_tenants_jobs_are_listed_newest_first_in_filtered_keyset_pages(jobs: Jobs) -> None:
    store = jobs.store
    first, second, third = sorted(new_id() for _ in range(3))  # ids of one millisecond are not in creation order
    a = await store.insert_job(one_shot(later(NOW, 60), id=first, name="nightly-a", labels={"team": "data"}), "x")
    b = await store.insert_job(one_shot(later(NOW, 120), id=second, name="hourly", pool="mail"), "x")
    c = await store.insert_job(one_shot(later(NOW, 180), id=third, name="nightly-c", labels={"env": "p"}), "x")
    await store.insert_job(one_shot(NOW, tenant="globex"), "x")
    await store.pause_job("acme", b["id"], "x")

    assert ids(await store.list_jobs("acme", JobFilter(), None, 10)) == [c["id"], b["id"], a["id"]]
    page = await store.list_jobs("acme", JobFilter(), None, 2)
    assert ids(page) == [c["id"], b["id"]] and page[0]["latest_execution_state"] is None
    assert ids(await store.list_jobs("acme", JobFilter(), page[-1]["id"], 2)) == [a["id"]]
    assert ids(await store.list_jobs("acme", JobFilter(name_prefix="nightly"), None, 10)) == [c["id"], a["id"]]
    assert ids(await store.list_jobs("acme", JobFilter(labels={"env": "p"}), None, 10)) == [c["id"]]
    assert ids(await store.list_jobs("acme", JobFilter(state="PAUSED", pool="mail"), None, 10)) == [b["id"]]
    window = JobFilter(next_fire_from=later(NOW, 60), next_fire_to=later(NOW, 180))
    assert ids(await store.list_jobs("acme", window, None, 10)) == [b["id"], a["id"]]
    counts = await store.count_jobs()
    assert (counts[("acme", "ACTIVE")], counts[("acme", "PAUSED")], counts[("globex", "ACTIVE")]) == (2, 1, 1)


async def test_a_tenants_jobs_are_listed_soonest_next_fire_first_in_keyset_pages(jobs: Jobs) -> None:
    store = jobs.store
    late, soon, never = (later(NOW, 600), later(NOW, 60), None)
    a = await store.insert_job(one_shot(late), "alice")
    b = await store.insert_job(one_shot(soon, name="nightly-b"), "alice")
    c = await store.insert_job(one_shot(never), "alice")
    d = await store.insert_job(one_shot(never), "alice")
    await store.insert_job(one_shot(later(NOW, 1), tenant="globex"), "bob")
    first, last = sorted([c["id"], d["id"]])  # no next fire: by id (ids made in one millisecond are not ordered)
    everything = [b["id"], a["id"], first, last]
    assert ids(await store.list_jobs_by_next_fire("acme", JobFilter(), None, 10)) == everything
    page = await store.list_jobs_by_next_fire("acme", JobFilter(), None, 1)
    assert ids(page) == [b["id"]]
    after_b = (page[-1]["next_fire_at"], page[-1]["id"])
    assert ids(await store.list_jobs_by_next_fire("acme", JobFilter(), after_b, 2)) == [a["id"], first]
    assert ids(await store.list_jobs_by_next_fire("acme", JobFilter(), (None, first), 10)) == [last]
    assert ids(await store.list_jobs_by_next_fire("acme", JobFilter(name_prefix="nightly"), None, 10)) == [b["id"]]


async def test_the_hydrator_pages_each_shards_due_jobs_and_finds_the_overdue_ones(jobs: Jobs) -> None:
    store = jobs.store
    at = later(NOW, 30)
    same = sorted([(await store.insert_job(one_shot(at), "h"))["id"] for _ in range(3)])
    await store.insert_job(one_shot(later(NOW, 3600)), "h")  # beyond the end
    other = await store.insert_job(one_shot(at, shard=1), "h")
    paused = await store.insert_job(one_shot(at), "h")
    await store.pause_job("acme", paused["id"], "h")

    start = Occurrence(uuid.UUID(int=0), NOW)
    first = await store.hydration_ranges({0: start, 1: start}, later(NOW, 60), 2)
    assert first[0] == [Occurrence(same[0], at), Occurrence(same[1], at)]
    assert first[1] == [Occurrence(other["id"], at)]
    rest = await store.hydration_ranges({0: first[0][-1]}, later(NOW, 60), 2)
    assert rest == {0: [Occurrence(same[2], at)]}

    late = await store.overdue_occurrences([0, 1, 2], later(NOW, 31), 2)
    assert len(late[0]) == 2 and {o.job_id for o in late[0]} <= set(same) and {o.due for o in late[0]} == {at}
    assert late[1] == [Occurrence(other["id"], at)] and late[2] == []
    execution_id = new_id()
    triggered = await store.insert_job(one_shot(later(NOW, 3600), shard=2), "h")
    await store.trigger_job("acme", triggered["id"], at, execution_id, "h")
    assert (await store.overdue_occurrences([2], later(NOW, 31), 2))[2] == [Occurrence(triggered["id"], at)]


async def test_jobs_that_ended_long_enough_ago_are_pruned_oldest_first(jobs: Jobs) -> None:
    store = jobs.store
    cancelled = [await store.insert_job(one_shot(NOW), "p") for _ in range(3)]
    for job in cancelled:
        await store.cancel_job("acme", job["id"], "p")
    kept = await store.insert_job(one_shot(NOW), "p")
    pending = await store.insert_job(one_shot(NOW), "p")
    await store.trigger_job("acme", pending["id"], NOW, new_id(), "p")
    await store.cancel_job("acme", pending["id"], "p")
    before = (await store.get_job("acme", pending["id"]) or {})["updated_at"] + timedelta(seconds=1)

    assert await store.prune_ended_jobs(before, 2) == 2
    assert await store.prune_ended_jobs(before, 10) == 1, "not the job with a manual run waiting"
    assert await store.prune_ended_jobs(before, 10) == 0
    assert [await store.get_job("acme", job["id"]) for job in cancelled] == [None, None, None]
    assert await store.get_job("acme", kept["id"]) is not None
