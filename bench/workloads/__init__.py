"""The bench's workloads, one module each, and the tools that go with them; :mod:`bench.catalog` lists them.

Each module with a command line has ``main(argv) -> int``; the parts of ``make bench``'s run
(:mod:`bench.suite`: ``ceilings``, ``create``, ``at_rest`` as W4, ``idle``) also offer the function it calls.
"""
