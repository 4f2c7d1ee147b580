"""The custom resources' schemas are vendored from their CRDs with a record of where they come from, and the
script that vendors them refuses what is not a CRD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sundial_infra.crd_schemas import SCHEMAS, extract, main, schema_path, validator

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "spec": {
        "group": "example.io",
        "names": {"kind": "Widget"},
        "versions": [
            {"name": "v1", "served": True, "schema": {"openAPIV3Schema": {"type": "object", "properties": {}}}},
            {"name": "v0", "served": False, "schema": {"openAPIV3Schema": {"type": "object"}}},
        ],
    },
}


def test_extract_records_the_source_of_each_served_version() -> None:
    files = extract(CRD, "Widgets v1.2.3 (commit abc), crd.yaml")
    assert list(files) == [schema_path("example.io/v1", "Widget")]
    [schema] = files.values()
    assert "Widgets v1.2.3 (commit abc), crd.yaml" in schema["$comment"]
    assert (schema["x-sundial-api-version"], schema["x-sundial-kind"], schema["type"]) == (
        "example.io/v1",
        "Widget",
        "object",
    )


def test_the_script_refuses_a_file_that_is_not_a_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deployment.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\n")
    assert main(["--source", "nowhere", str(path)]) == 1
    assert capsys.readouterr().err == f"{path}: not a CustomResourceDefinition: kind 'Deployment'\n"


def test_every_vendored_schema_says_which_release_and_commit_it_comes_from() -> None:
    paths = sorted(SCHEMAS.glob("*/*.json"))
    assert len(paths) == 3
    for path in paths:
        schema = json.loads(path.read_text())
        assert " v" in schema["$comment"] and "(commit " in schema["$comment"], path
        assert validator(schema["x-sundial-api-version"], schema["x-sundial-kind"]).schema["type"] == "object"
