"""Which live dispatcher replica should lead which shard: balanced rendezvous hashing.

Every replica computes the placement from the same input — the sorted set of live replica ids in the
etcd registry — with a pure, deterministic function, so replicas whose views agree agree on every
owner without talking to each other. Nothing here is authoritative: leadership is still won in etcd
and fenced in Postgres; the placement only decides who *contends first* and who hands a shard over.

**Rendezvous (highest random weight).** Each (replica, shard) pair gets a weight from a stable hash;
a shard prefers replicas in decreasing weight order. Plain rendezvous moves only the shards a joining
replica wins (or a leaving one held), but with few shards its loads are lumpy: 8 shards over 2
replicas give a 6/2 split or worse nearly a third of the time (74 in 256).

**Bounded loads.** So pairs are taken greedily in decreasing weight, and a replica stops accepting
shards once it has its fair share: ``⌊S/R⌋`` each, plus one for the first ``S mod R`` replicas to fill
up. Every replica ends with ``⌊S/R⌋`` or ``⌈S/R⌉`` shards. A join or leave still moves few shards —
the newcomer's (leaver's) share plus a short cascade of replicas that lost a shard picking their next
best one. Measured over random replica ids (``tests/unit/test_balance.py`` keeps it that way): with the
default 8 shards, 2 → 3 replicas moves 3 shards on average (the newcomer's share is 2–3) and never more
than 5; 64 shards, 4 → 5 moves 15 on average for a share of 12–13. A ``hash mod R`` placement would
move about ``S·R/(R+1)``: 5–6 of 8, 51 of 64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["moves", "placement", "weight"]


def weight(replica_id: str, shard: int) -> int:
    """The pair's rendezvous weight: stable across processes and Python versions (not ``hash()``)."""
    digest = hashlib.blake2b(f"{replica_id}\x00{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def placement(shards: int, replicas: Iterable[str]) -> dict[int, str]:
    """Shard → the replica that should lead it; empty if there are no replicas."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    members = sorted(set(replicas))
    if not members:
        return {}
    base, extra = divmod(shards, len(members))
    # Ties on weight (astronomically unlikely) break on shard then replica id, so the order is total.
    pairs = sorted(
        ((weight(replica, shard), shard, replica) for shard in range(shards) for replica in members), reverse=True
    )
    load = dict.fromkeys(members, 0)
    owner: dict[int, str] = {}
    full = 0  # replicas that already took base + 1 shards
    for _weight, shard, replica in pairs:
        if shard in owner:
            continue
        if load[replica] < base or (load[replica] == base and full < extra):
            if load[replica] == base:
                full += 1
            owner[shard] = replica
            load[replica] += 1
            if len(owner) == shards:
                break
    return owner


def moves(before: Mapping[int, str], after: Mapping[int, str]) -> int:
    """How many shards change owner between two placements."""
    return sum(1 for shard, replica in after.items() if before.get(shard) != replica)
