"""sundial_gateway: the worker gateway — workers in any language, holding only a pool token, run a pool's work.

``sundial gateway`` serves ``POST /v1/worker/pull``, ``/heartbeat``, ``/finish`` and ``/token`` (see
:mod:`sundial_gateway.app`). It holds the credentials a direct worker holds (Postgres, Redis, the broker, the master
key) so that the workers calling it need none of them.
"""
