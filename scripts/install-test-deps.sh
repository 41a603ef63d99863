#!/usr/bin/env bash
# The system packages the test suite needs, installed when missing. `.ci/run` and `make test`
# both call this, so that a fresh machine runs every test instead of skipping some.
#
#   scripts/install-test-deps.sh           install what is missing (apt, as root or via sudo)
#   scripts/install-test-deps.sh --check   only list what is missing; exit 1 if anything is
#
# OSB_SKIP_TEST_DEPS=1 skips the step (a machine that is not Debian-like, set up by hand).
set -euo pipefail

# busybox-static: the libc-less pod image of the end-to-end simulation; iproute2: its veth
# link, and the network namespace of scripts/demo.sh (tests/demo.rs); util-linux:
# unshare/nsenter/setpriv; python3: the hostile children of the layer tests;
# python3-venv, make, git, nodejs: the real workloads of tests/workloads.rs and
# tests/namespaces.rs; gcc, libc6-dev, binutils: the C probes and the static-binary checks;
# openssh-client: `openshell sandbox connect`'s client in tests/gateway_main_session.rs and
# ssh -L / sftp of tests/gateway_forward.rs and tests/gateway_sftp.rs; tar:
# tests/gateway_sftp.rs's upload and download; runc and crun: the real OCI runtimes of the e2e
# pods; procps, coreutils: ps, timeout and friends in the test scripts; curl, python3-pip,
# ca-certificates: the real clients of the egress tests (tests/egress_tools.rs,
# tests/egress_l7.rs, tests/egress_run.rs, tests/egress_https_run.rs), pip against a local
# index; python3-requests: the requests client of tests/egress_https_run.rs; bsdutils:
# `script`, the caller's terminal of tests/command_group.rs.
PACKAGES=(
  busybox-static iproute2 util-linux python3 python3-venv gcc libc6-dev binutils make git
  nodejs openssh-client runc crun procps coreutils tar curl python3-pip python3-requests
  ca-certificates bsdutils
)

if [[ "${OSB_SKIP_TEST_DEPS:-}" == 1 ]]; then
  echo "install-test-deps: skipped (OSB_SKIP_TEST_DEPS=1)"
  exit 0
fi
if ! command -v dpkg-query >/dev/null; then
  echo "install-test-deps: no dpkg here; install the equivalents of: ${PACKAGES[*]}" >&2
  echo "install-test-deps: then rerun with OSB_SKIP_TEST_DEPS=1" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-test-deps: every package is installed"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  echo "install-test-deps: missing: ${missing[*]}"
  exit 1
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "install-test-deps: missing ${missing[*]}, and installing needs root:" >&2
    echo "  sudo apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-test-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
