"""The create routes' request path (``POST /v1/jobs``, ``POST /v1/jobs:batch``): the endpoint called directly.

FastAPI answers a request by solving the endpoint's dependency graph (the state, the bearer scheme, the
tenant, each header and the body, every time with its generic machinery), after parsing the content type
with the standard library's ``email`` package and the body with ``json.loads``. For a single create that
was a fifth of the API's CPU (py-spy under wrk: ``solve_dependencies`` 18% of the samples, against 14% for
``create_job`` itself). A create's request is almost always the same shape — ``Content-Type:
application/json`` and a body that validates — so :class:`CreateRoute` reads that shape directly: the body
parsed by orjson (:func:`sundial_api.json_body.loads`) and validated by the body's model, the tenant
authenticated (:func:`sundial_api.auth.principal_of`), then the endpoint called. Anything else (another
content type, a body that is not JSON or does not validate) goes to FastAPI's own handler, which answers it
exactly as before (its ``json()`` is orjson's too): the errors, their order and their problem documents are
FastAPI's. The route is declared as any other (same signature, same OpenAPI document); only how it is called
changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, get_type_hints

from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sundial_api.auth import principal_of
from sundial_api.json_body import OrjsonRequest, loads
from sundial_api.state import get_state

#: The parameters an endpoint of this route takes, in order (what both create endpoints are).
PARAMETERS = ("body", "state", "principal", "idempotency_key")


class CreateRoute(APIRoute):
    """A route for an endpoint ``(body: <model>, state: State, principal: Authenticated, idempotency_key)``."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if tuple(inspect.signature(endpoint).parameters) != PARAMETERS:
            raise TypeError(f"{endpoint.__qualname__} must take exactly {PARAMETERS} to be a CreateRoute")
        model = get_type_hints(endpoint)["body"]
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"{endpoint.__qualname__}'s body must be a pydantic model, not {model!r}")
        self.body_model: type[BaseModel] = model
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        generic = super().get_route_handler()
        model, endpoint = self.body_model, self.endpoint

        async def route_handler(request: Request) -> Response:
            # One request object for both paths: the body, once read, is kept on it (the stream is gone).
            request = OrjsonRequest(request.scope, request.receive)
            if request.headers.get("content-type") == "application/json":
                try:
                    body = model.model_validate(loads(await request.body()))
                except ValueError:  # not JSON, or invalid (pydantic's ValidationError): FastAPI's errors answer
                    pass
                # A body too deep or holding text Postgres refuses raises BodyRefused: answered as it is, 4xx.
                else:
                    state = await get_state(request)
                    principal = await principal_of(request, state)
                    response: Response = await endpoint(body, state, principal, request.headers.get("idempotency-key"))
                    return response
            return await generic(request)

        return route_handler
