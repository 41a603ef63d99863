#!/usr/bin/env bash
# Run the chart checks (installer/ci/test_chart.py): helm lint --strict, helm template for
# every mode against Kubernetes 1.33, strict offline validation of every object, the example
# Sandbox against our CRD, and the contract assertions.
#
# Tools come from installer/ci/setup-tools.sh (default dir <repo>/.build/tools, or
# $OPENSHELL_TOOLS_DIR). When they are missing this exits 77 ("skipped") after saying why,
# or 1 when CI=true.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools=${OPENSHELL_TOOLS_DIR:-$repo_root/.build/tools}
helm="$tools/bin/helm"

missing=()
[[ -x "$helm" ]] || missing+=("helm ($helm)")
PYTHONPATH="$tools/pylib${PYTHONPATH:+:$PYTHONPATH}" python3 -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null \
    || missing+=("kubernetes-validate (python, $tools/pylib)")
if ((${#missing[@]})); then
    echo "check-chart: SKIPPED: missing ${missing[*]}; run installer/ci/setup-tools.sh" >&2
    [[ "${CI:-}" == "true" ]] && { echo "check-chart: CI=true forbids skipping" >&2; exit 1; }
    exit 77
fi

export HELM="$helm"
export PYTHONPATH="$tools/pylib${PYTHONPATH:+:$PYTHONPATH}"
exec python3 "$repo_root/installer/ci/test_chart.py" "$@"
