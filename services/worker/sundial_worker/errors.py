"""What goes wrong in the worker runtime and how it tells: the errors its loops wait out, the crash of a
side task, and the message for a bad configuration field.

Database and Redis errors listed here are transient (connection trouble, failover, overload, lock
conflicts): a loop logs them and tries again. Any other exception is a bug and fails the runtime loudly
(:class:`WorkerCrashed`) instead of retrying forever.
"""

from __future__ import annotations

import asyncpg
from redis.exceptions import RedisError

TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)


class StartupError(RuntimeError):
    """The worker cannot start as configured; the message is one line naming the setting to change."""


class WorkerCrashed(RuntimeError):
    """A side task of the runtime died; the process should exit non-zero."""


def check_positive_int(config: object, *names: str) -> None:
    """Raise ValueError naming ``Config.field`` unless each field is an int of at least 1."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive integer; got {value!r}")


def check_seconds(config: object, *names: str, zero_ok: bool = False) -> None:
    """Raise ValueError naming ``Config.field`` unless each field is a number of seconds > 0 (>= 0 with ``zero_ok``)."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int | float) or value < 0 or (value == 0 and not zero_ok):
            kind = "zero or more seconds" if zero_ok else "a positive number of seconds"
            raise ValueError(f"{type(config).__name__}.{name} must be {kind}; got {value!r}")
