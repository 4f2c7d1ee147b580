"""The four stateful servers Sundial depends on, one module per kind, as plain OS processes (no Docker).

``base`` holds what they share (the start/stop contract, pid files, readiness with a deadline);
``postgres``, ``redis``, ``etcd`` and ``broker`` say how each one is initialised, started, probed and
stopped. ``sundial_infra.stack`` composes them on one port set.
"""
