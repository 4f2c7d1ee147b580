"""The tenant's and the operator's ``sundial`` commands over the API: one module per command group.

``jobs``, ``executions``, ``stats``, ``tenants``, ``pools``, ``breakers``, ``notifications``, ``replay``, ``bulk``;
what they share (exit codes, tables, the runner) is :mod:`~sundial_client.cli.common`, where the API is and who you are
:mod:`~sundial_client.cli.connection`, how jobs and executions read as text :mod:`~sundial_client.cli.render`.
A command imports the client (httpx, pydantic) only when it runs, so every ``--help`` is quick.
"""
