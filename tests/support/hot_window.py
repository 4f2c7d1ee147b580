"""What a hot window's sorted set holds, as a test reads it: the members of a key, decoded."""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis


async def window_members(redis: Redis, key: str) -> set[str]:
    """Every member of the sorted set ``key`` (``j:<job>``, ``r:<execution>:<attempt>`` …).

    redis-py types ``zrange`` as a union over its options (scores, decoded responses); without scores, on a client
    that does not decode, it is a list of bytes — which the cast states.
    """
    return {m.decode() for m in cast(list[bytes], await redis.zrange(key, 0, -1))}
