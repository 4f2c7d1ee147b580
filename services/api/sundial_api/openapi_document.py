"""The OpenAPI document, corrected to say what the API does where FastAPI's generator cannot.

FastAPI generates the document from the routes; these passes publish what the generator has no way to know:

- error responses are ``application/problem+json`` with the Problem schema (never FastAPI's
  ``HTTPValidationError``);
- every operation with a JSON body may answer 400 (a body that is not UTF-8 or is nested too deep:
  :mod:`sundial_api.json_body`);
- ``PATCH /v1/jobs/{id}``'s fields take the types of the job body (its model reads them as anything, because the
  job as changed is validated whole, like a new one);
- ``Idempotency-Key`` is 1-255 visible ASCII characters (checked by :mod:`sundial_api.idempotency`);
- an empty ``cursor`` is the first page, as an absent one (:mod:`sundial_api.input_guard`).
"""

from __future__ import annotations

import copy
from typing import Any

from sundial_api.problems import responses

#: ``Idempotency-Key`` as :mod:`sundial_api.idempotency` accepts it.
IDEMPOTENCY_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"}
EMPTY_CURSOR = " An empty cursor is the first page, as an absent one."


def corrected(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document) with every correction of this module applied."""
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            _body_errors(operation)
            _parameters(operation)
    _problem_media_types(schema)
    _typed_patch(schema.get("components", {}).get("schemas", {}))
    return schema


def _body_errors(operation: dict[str, Any]) -> None:
    if "requestBody" in operation:
        for status, response in responses(400).items():
            operation.setdefault("responses", {}).setdefault(str(status), _problem_response(response["description"]))


def _problem_response(description: str) -> dict[str, Any]:
    media = {"schema": {"$ref": "#/components/schemas/Problem"}}
    return {"description": description, "content": {"application/json": media}}


def _parameters(operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "header" and parameter.get("name") == "Idempotency-Key":
            description = parameter.get("schema", {}).get("description")
            parameter["schema"] = {**IDEMPOTENCY_KEY_SCHEMA, **({"description": description} if description else {})}
        elif parameter.get("in") == "query" and parameter.get("name") == "cursor":
            parameter["description"] = parameter.get("description", "") + EMPTY_CURSOR
            if "description" in parameter.get("schema", {}):
                parameter["schema"]["description"] = parameter["description"]


def _problem_media_types(schema: dict[str, Any]) -> None:
    """Publish error responses as they are sent: ``application/problem+json`` with the Problem schema.

    FastAPI files every documented response model under the route's default media type (JSON), and adds
    its own ``HTTPValidationError`` 422 to routes with parameters; the API answers every validation error
    with a Problem instead (see ``problems.py``), so the document says that.
    """
    problem = {"$ref": "#/components/schemas/Problem"}
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if str(status)[0] in "45" and "application/json" in content:
                    media = content["application/json"]
                    if media.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                        media = {"schema": problem}
                        response["description"] = "Invalid input; `errors` names each field at fault."
                    response["content"] = {"application/problem+json": media}
    schemas = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)


def _typed_patch(schemas: dict[str, Any]) -> None:
    """Each ``JobPatch`` field typed as the job body's field of that name, or null (which clears it)."""
    patch, create = schemas.get("JobPatch"), schemas.get("JobCreate")
    if patch is None or create is None:
        return
    for name, field in patch.get("properties", {}).items():
        typed = create.get("properties", {}).get(name)
        if typed is None:
            continue
        typed = copy.deepcopy(typed)
        alternatives = typed.pop("anyOf", None) or [{k: v for k, v in typed.items() if k not in _ANNOTATIONS}]
        if {"type": "null"} not in alternatives:
            alternatives.append({"type": "null"})
        patch["properties"][name] = {
            "anyOf": alternatives,
            **{k: v for k, v in field.items() if k in ("title", "description")},
        }


#: Keywords that describe a field rather than constrain its type.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "nullable"})
