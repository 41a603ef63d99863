#!/usr/bin/env bash
# A local sandboxed run: normal work succeeds, a write outside the workdir and a network
# connect are refused, and the exit report says what was enforced.
set -euo pipefail
BIN=$(realpath "${1:-target/debug/openshell-sandbox}")
WD=$(mktemp -d /tmp/openshell-demo.XXXXXX)
trap 'rm -rf "$WD"' EXIT
chmod 755 "$WD"
flags=()
if [ "$(id -u)" = 0 ]; then
  chown 65534:65534 "$WD"          # the sandbox uid must own its workdir
else
  echo "(not root: the child keeps your uid; Landlock and seccomp still apply)"
fi
echo "== openshell-sandbox check --workdir $WD"
"$BIN" check --workdir "$WD" || flags+=(--allow-degraded)
echo
echo "== openshell-sandbox run --workdir $WD -- python3 demo.py"
cat > "$WD/demo.py" <<'PY'
import errno, os, socket
print("normal work:   sum(range(10**6)) =", sum(range(10**6)))
open("result.txt", "w").write("written inside the workdir\n")
print("workdir write: ok ->", open("result.txt").read().strip())
try:
    open("/etc/evil", "w")
    print("outside write: ALLOWED (bad)")
except OSError as e:
    print("outside write: refused,", errno.errorcode[e.errno])
try:
    socket.create_connection(("127.0.0.1", 22), timeout=2)
    print("network:       ALLOWED (bad)")
except OSError as e:
    print("network:       refused,", errno.errorcode.get(e.errno, e.errno))
print("running as uid", os.getuid())
PY
cd "$WD"
"$BIN" run "${flags[@]}" -v --workdir "$WD" --timeout 30 -- python3 demo.py
