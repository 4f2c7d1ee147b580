"""The pool registry as a fair pass needs it: whether every pool a claimed job can be in has a room of its own."""

from __future__ import annotations

from collections.abc import Collection

from sundial_common.stores.tenants import TenantStore


class RegisteredPools:
    """The registered production pools' names (staging pools run replays only), read again at most every
    ``refresh_sec`` (one small statement).

    The API accepts a job only for a registered production pool, and a pool is deleted or made staging only while no
    job that can fire targets it: so when each of them has a room of its own in a pass (live workers announced, work
    open, or seen starting work), no claimed job can be in a pool not seen at all, whose room is a share of the small
    first cap. A pass larger than a burst head may then go out whole without looking up whose its members are. An
    empty registry vouches for nothing: jobs written around the API (tests, imports) may name any pool.
    """

    def __init__(self, store: TenantStore, refresh_sec: float) -> None:
        self.store = store
        self.refresh_sec = refresh_sec
        #: At the last read (None: not read yet).
        self.names: frozenset[str] | None = None
        self._read_at: float | None = None

    async def read(self, now: float) -> None:
        """Read the names again if the last read is older than ``refresh_sec`` (the shards' passes share it: the
        first pass due to read takes the turn, so concurrent passes do not read it again)."""
        if self._read_at is not None and now - self._read_at < self.refresh_sec:
            return
        self._read_at = now
        self.names = frozenset(await self.store.registered_pools())

    def all_seen(self, seen: Collection[str]) -> bool:
        """Every registered pool is among ``seen`` (the pools a pass has a room for)."""
        return bool(self.names and self.names.issubset(seen))
