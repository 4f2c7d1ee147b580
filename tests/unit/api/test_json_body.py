"""The API's body parser gives exactly what ``json.loads`` gives, or its error — except for bodies no handler could
take (too deep, a lone surrogate, a NUL), which it refuses naming the field."""

from __future__ import annotations

import json

import pytest
from sundial_api.idempotency import canonical_json
from sundial_api.json_body import MAX_DEPTH, loads
from sundial_api.problems import BodyRefused


@pytest.mark.parametrize(
    "body",
    [
        b'{"jobs": [{"name": "a", "payload": {"n": 1, "f": 0.1, "s": "\\u00e9", "z": null}}]}',
        b"[18446744073709551615, -9223372036854775808, 1.0000000000000000000001]",
        b'{"n": 123456789012345678901234567890}',
        b'{"n": -18446744073709551616}',
        b'{"x": NaN, "y": Infinity, "z": 1e400}',
        b'\xef\xbb\xbf{"bom": true}',
        '{"utf16": 1}'.encode("utf-16"),
        b'{"a": 1, "a": 2}',
    ],
)
def test_the_values_are_the_standard_librarys(body: bytes) -> None:
    expected = json.loads(body)
    actual = loads(body)
    assert repr(actual) == repr(expected)


@pytest.mark.parametrize("body", [b'{"jobs": [', b"", b"[1,]", b"\xff"])
def test_the_errors_are_the_standard_librarys(body: bytes) -> None:
    with pytest.raises(Exception) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value)) as actual:
        loads(body)
    assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_a_body_nested_too_deep_is_a_400_not_a_recursion_error(depth: int) -> None:
    for body in (
        b"[" * depth + b"]" * depth,
        b'{"n": 12345678901234567890, "x": ' + b"[" * depth + b"]" * depth + b"}",
    ):
        with pytest.raises(BodyRefused) as refused:
            loads(body)
        assert refused.value.status_code == 400 and refused.value.errors[0]["field"] == "body"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"target": {"pool": "\\ud800"}}', "target.pool"),
        (b'{"labels": {"env": "a\\udfffb"}}', "labels.env"),
        (b'{"jobs": [{}, {"schedule": "\\ud800"}]}', "jobs[1].schedule"),
        (b'{"labels": {"\\ud800": "x"}}', "labels"),
        (b'{"name": "a\\u0000b"}', "name"),
        (b'{"payload": {"deep": ["a\\u0000"]}}', "payload"),
    ],
)
def test_text_postgres_cannot_store_is_a_422_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(BodyRefused) as refused:
        loads(body)
    assert refused.value.status_code == 422 and [e["field"] for e in refused.value.errors] == [field]


def test_an_escaped_backslash_before_u0000_is_text_not_a_nul() -> None:
    assert loads(b'{"name": "a\\\\u0000"}') == {"name": "a\\u0000"}


def test_the_idempotency_hash_writes_any_depth_as_the_standard_library_writes_json() -> None:
    values: tuple[object, ...] = (
        {"b": [1, {"z": None, "a": "\u00e9"}], "a": 1.5},
        [],
        {},
        [[[]]],
        "}",
        10**30,
        {"k": [True]},
    )
    for value in values:
        assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    assert canonical_json(deep) == b"[" * 5001 + b"]" * 5001
