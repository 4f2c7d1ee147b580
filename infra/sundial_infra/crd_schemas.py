"""The vendored schemas of the custom resources the Kubernetes manifests use, and how they are made.

``kubernetes-validate`` carries the schemas of Kubernetes' own kinds only. The Prometheus Operator's
``PodMonitor`` and ``PrometheusRule`` and KEDA's ``ScaledObject`` are checked against the ``openAPIV3Schema`` of
their CustomResourceDefinitions, copied once into ``deploy/kubernetes/schemas/<group>/<kind>_<version>.json``
(each file's ``$comment`` says which project, release, commit and CRD file it comes from). Tests never reach the
network: to move to another release, take that release's CRD files from the project's repository at its tag and
run, for example::

    python -m sundial_infra.crd_schemas --source "KEDA v2.20.1 (commit 875675c)" \\
        config/crd/bases/keda.sh_scaledobjects.yaml

:func:`validator` checks an object strictly, as ``kubernetes-validate --strict`` does Kubernetes' kinds: a
field the schema does not name is an error (the API server would silently drop it), except where the schema
preserves unknown fields.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from jsonschema import Draft7Validator

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "deploy" / "kubernetes" / "schemas"


def schema_path(api_version: str, kind: str) -> Path:
    """Where the schema of ``kind`` in ``group/version`` is vendored."""
    group, _, version = api_version.rpartition("/")
    return SCHEMAS / (group or "core") / f"{kind.lower()}_{version}.json"


def vendored() -> set[tuple[str, str]]:
    """Every (apiVersion, kind) with a vendored schema."""
    found = set()
    for path in SCHEMAS.glob("*/*.json"):
        schema = json.loads(path.read_text())
        found.add((schema["x-sundial-api-version"], schema["x-sundial-kind"]))
    return found


def _strict(schema: Any) -> Any:
    """A copy of ``schema`` where an object with named properties admits no other field."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def validator(api_version: str, kind: str) -> Draft7Validator:
    """A strict validator for ``kind`` objects; ``FileNotFoundError`` if its schema is not vendored."""
    # jsonschema comes with the development tools (kubernetes-validate), not with the stack this package runs.
    from jsonschema import Draft7Validator

    schema = json.loads(schema_path(api_version, kind).read_text())
    return Draft7Validator(_strict(schema))


def extract(crd: dict[str, Any], source: str) -> dict[Path, dict[str, Any]]:
    """The schema file of each served version of one CustomResourceDefinition, recording ``source``."""
    if crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"not a CustomResourceDefinition: kind {crd.get('kind')!r}")
    spec = crd["spec"]
    kind = spec["names"]["kind"]
    files = {}
    for version in spec["versions"]:
        schema = version.get("schema", {}).get("openAPIV3Schema")
        if schema is None or not version.get("served", True):
            continue
        api_version = f"{spec['group']}/{version['name']}"
        header = {
            "$comment": f"openAPIV3Schema of {kind} {api_version} from {source}; "
            "written by `python -m sundial_infra.crd_schemas`: replace it, do not edit it.",
            "x-sundial-api-version": api_version,
            "x-sundial-kind": kind,
        }
        files[schema_path(api_version, kind)] = {**header, **schema}
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sundial_infra.crd_schemas",
        description="Vendor the openAPIV3Schema of CustomResourceDefinitions under deploy/kubernetes/schemas.",
    )
    parser.add_argument(
        "--source",
        required=True,
        help='Where the CRD files come from, recorded in each schema: project, release and commit, e.g. "KEDA v2.20.1 '
        '(commit 875675c)"; the path of each file as given is added.',
    )
    parser.add_argument("crds", nargs="+", type=Path, help="CRD YAML files (a file may hold several documents).")
    args = parser.parse_args(argv)
    for crd_file in args.crds:
        try:
            documents = [d for d in yaml.safe_load_all(crd_file.read_text()) if d]
            written = {}
            for document in documents:
                written.update(extract(document, f"{args.source}, {crd_file.as_posix()}"))
        except (OSError, yaml.YAMLError, ValueError, KeyError) as error:
            print(f"{crd_file}: {error}", file=sys.stderr)
            return 1
        for path, schema in written.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(schema, indent=1, sort_keys=False) + "\n")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
