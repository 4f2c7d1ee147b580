"""The reference pages of the documentation site, generated from the code (``python -m docs_gen``).

These pages (or parts of pages) are written here and nowhere else:

* ``http-api.md`` from the live OpenAPI document of the API's app factory;
* ``cli.md`` from the argparse parsers of every ``sundial`` subcommand (found through the command's entry points);
* ``configuration.md`` from the services' settings classes (every ``SUNDIAL_*`` variable);
* ``metrics.md`` from the Prometheus registry once every Sundial module has declared its metrics;
* ``docs/architecture/leadership.md``, the opening essay of the leadership module;
* the figures table of ``docs/performance.md``, from the bench's newest result record of each workload;
* the migrations table of ``docs/operations/upgrades.md``, from the migrations' docstrings.

Every import of Sundial's code that the generators need is in :mod:`docs_gen.sources`, so a module that moves
breaks one line there. ``python -m docs_gen --check`` writes nothing and exits 1 when a page on disk differs
from what the code says (a test runs it).
"""
