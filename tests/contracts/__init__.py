"""The contract suite: each test runs against every implementation of a store protocol — the Postgres store and
its in-memory fake from :mod:`sundial_common.testing` — so the fake cannot drift from the real thing."""
