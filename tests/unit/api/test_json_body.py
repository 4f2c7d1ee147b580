"""The batch endpoint's body parser gives exactly what ``json.loads`` gives, or its error."""

from __future__ import annotations

import json

import pytest
from sundial_api.json_body import loads


@pytest.mark.parametrize(
    "body",
    [
        b'{"jobs": [{"name": "a", "payload": {"n": 1, "f": 0.1, "s": "\\u00e9", "z": null}}]}',
        b"[18446744073709551615, -9223372036854775808, 1.0000000000000000000001]",
        b'{"n": 123456789012345678901234567890}',
        b'{"n": -18446744073709551616}',
        b'{"x": NaN, "y": Infinity, "z": 1e400}',
        b'"\\ud800"',
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
