"""The API's documented shapes, one module per resource.

- :mod:`~sundial_api.models.common`: the request and view bases, RFC 3339 instants, problem documents, probes;
- :mod:`~sundial_api.models.schedules`: job types and the schedule fields a job body and a preview share;
- :mod:`~sundial_api.models.jobs`: the job body, its patch, the job views;
- :mod:`~sundial_api.models.executions`: the execution and attempt views and their pages;
- :mod:`~sundial_api.models.batch`: the batch create body;
- :mod:`~sundial_api.models.admin`: the cluster view.

Request models validate everything that can be checked without the clock or the database and name the
offending field in camelCase (``extra="forbid"``: an unknown field is an error, not silently dropped).
The views (response models) are defined once, in :mod:`sundial_client.models`, which the client reads
answers with; each module here imports its resource's views and documents them for OpenAPI. The handlers
build the same shapes as plain dicts with the ``render_*`` functions beside them (one pass over a database
row, no model validation on the hot path), and a unit test keeps the two in step.
"""
