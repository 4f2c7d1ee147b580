"""The HTTP references: the OpenAPI documents of the API's and the worker gateway's app factories, as Markdown."""

from __future__ import annotations

import json
from typing import Any

from docs_gen.sources import gateway_openapi_document, openapi_document
from docs_gen.text import cell, prose

_METHODS = ("get", "post", "put", "patch", "delete")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return f"schema-{name.lower()}"


def _type(schema: dict[str, Any]) -> str:
    """A short human type: `string`, `integer`, [`Job`](#schema-job), `array of …`, `A or null`."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[`{name}`](#{_anchor(name)})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            parts = [_type(s) for s in schema[key]]
            return " or ".join(dict.fromkeys(parts))
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {_type(schema['additionalProperties'])}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if kind is None:
        return "any"
    fmt = schema.get("format")
    return f"`{kind}`" + (f" ({fmt})" if fmt else "")


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### {method.upper()} `{path}`", ""]
    if op.get("summary"):
        lines += [f"**{prose(op['summary'])}**", ""]
    if op.get("description"):
        lines += [prose(op["description"]), ""]
    auth = "bearer token" if op.get("security") else "none"
    lines += [f"Authentication: {auth}.", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | |", "| --- | --- | --- | --- | --- |"]
        for p in params:
            required = "yes" if p.get("required") else "no"
            lines.append(
                f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}))} | {required} | "
                f"{cell(p.get('description', ''))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body (`{media}`): {_type(content.get('schema', {}))}", ""]
    lines += ["| status | | body |", "| --- | --- | --- |"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"{_type(content.get('schema', {}))} (`{media}`)" for media, content in response.get("content", {}).items()
        ]
        lines.append(f"| {status} | {cell(response.get('description', ''))} | {', '.join(bodies)} |")
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [prose(schema["description"]), ""]
    if "enum" in schema:
        lines += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | default | |", "| --- | --- | --- | --- | --- |"]
        for field, prop in properties.items():
            default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
            lines.append(
                f"| `{field}` | {_type(prop)} | {'yes' if field in required else 'no'} | {cell(default)} | "
                f"{cell(prop.get('description', ''))} |"
            )
        lines.append("")
    return lines


def render() -> str:
    doc = openapi_document()
    return _render(
        doc,
        "HTTP API reference",
        "the API's OpenAPI document",
        "A running API serves the same document at `/openapi.json`, Swagger UI at `/docs` and ReDoc at `/redoc` "
        "(for the local stack: <http://127.0.0.1:8080/docs>). Errors are `application/problem+json` "
        "([`Problem`](#schema-problem)) whose `errors` name each field at fault.",
    )


def render_gateway() -> str:
    doc = gateway_openapi_document()
    return _render(
        doc,
        "Worker protocol reference",
        "the worker gateway's OpenAPI document",
        "What a worker holding a pool token calls (`sundial gateway`; the local stack's at <http://127.0.0.1:8081>, "
        "which serves the same document at `/openapi.json`). Every call carries `Authorization: Bearer <pool "
        "token>`. Errors are `application/problem+json` with `status` and `detail`; bad input is 422 with "
        "`errors` naming each field. The [any-language workers guide](../guides/gateway-workers.md) walks through "
        "a session.",
    )


def _render(doc: dict[str, Any], title: str, source: str, intro: str) -> str:
    info = doc["info"]
    lines = [
        f"# {title}",
        "",
        f"<!-- Generated by `python -m docs_gen` from {source}: do not edit. -->",
        "",
        f"{prose(info.get('summary', ''))} Version {info['version']}, OpenAPI {doc['openapi']}.",
        "",
        intro,
        "",
    ]
    if info.get("description"):
        lines += [prose(info["description"]), ""]
    tags = [t["name"] for t in doc.get("tags", [])]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method in _METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, op))
    descriptions = {t["name"]: t.get("description", "") for t in doc.get("tags", [])}
    for tag in [*tags, *sorted(t for t in by_tag if t not in tags)]:
        if tag not in by_tag:
            continue
        lines += [f"## {tag}", ""]
        if descriptions.get(tag):
            lines += [prose(descriptions[tag]), ""]
        for path, method, op in by_tag[tag]:
            lines += _operation(path, method, op)
    lines += ["## Schemas", ""]
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        lines += _schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"
