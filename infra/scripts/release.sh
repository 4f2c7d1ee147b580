#!/usr/bin/env bash
# `make release VERSION=x.y.z`: cut a release from a clean main.
#   1. every package's version becomes x.y.z (they release together), the lock follows;
#   2. CHANGELOG.md's "Unreleased" section becomes "[x.y.z] - <today>" under a new, empty "Unreleased";
#   3. the Kubernetes base pins image sundial:x.y.z and names the migration Job after it;
#   4. one commit "Release x.y.z" and an annotated tag vx.y.z (pushing is left to you);
#   5. the wheels are built into dist/x.y.z/ and installed into a fresh virtualenv, whose `sundial --version`
#      must answer x.y.z.
# `make release VERSION=x.y.z DRY_RUN=1` does only step 5, on the tree as it is, and changes nothing.
# The image is built from the tagged tree: `docker build -f infra/Dockerfile -t <registry>/sundial:x.y.z .`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
version=${1:-}
dry=${DRY_RUN:-}
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "usage: make release VERSION=x.y.z [DRY_RUN=1]" >&2
    exit 2
fi
manifests=(pyproject.toml libs/*/pyproject.toml services/*/pyproject.toml infra/pyproject.toml)

if [ -z "$dry" ]; then
    [ -z "$(git status --porcelain)" ] || { echo "release: the working tree is not clean" >&2; exit 1; }
    git rev-parse -q --verify "refs/tags/v$version" >/dev/null && { echo "release: v$version exists" >&2; exit 1; }
    grep -q '^## \[Unreleased\]' CHANGELOG.md || { echo "release: CHANGELOG.md has no Unreleased section" >&2; exit 1; }
    sed -i -E "0,/^version = \"[^\"]+\"/s//version = \"$version\"/" "${manifests[@]}"
    uv lock --quiet
    sed -i "s/^## \[Unreleased\]/## [Unreleased]\n\n## [$version] - $(date -u +%F)/" CHANGELOG.md
    tag=${version//./-}
    sed -i -E "s/image: sundial:[0-9.]+/image: sundial:$version/; s/sundial-migrate-[0-9-]+/sundial-migrate-$tag/" \
        deploy/kubernetes/base/*.yaml
    sed -i -E "s/newTag: [0-9.]+/newTag: $version/" deploy/kubernetes/overlays/*/kustomization.yaml
    git commit -q -am "Release $version" -m "Every package at $version; CHANGELOG, image tags and the migration Job follow."
    git tag -a "v$version" -m "Sundial $version"
    echo "tagged v$version"
fi

out=dist/$version
check=.sundial/release-check
rm -rf "$out" "$check"
uv build --all-packages --wheel --quiet --out-dir "$out"
uv venv --quiet "$check"
uv pip install --quiet --python "$check/bin/python" "$out"/*.whl
installed=$("$check/bin/sundial" --version)
echo "built $(ls "$out" | wc -l) wheels into $out; a fresh install answers: $installed"
[ -n "$dry" ] || [ "$installed" = "sundial $version" ] || { echo "release: expected sundial $version" >&2; exit 1; }
"$check/bin/sundial" migrate --help >/dev/null
