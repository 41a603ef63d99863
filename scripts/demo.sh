#!/usr/bin/env bash
# The sandbox at work, on this machine only: normal work succeeds; a write outside the workdir
# is refused; a listener this script starts on the machine's loopback answers outside the
# sandbox and is out of reach inside it; and, in a private network namespace standing for the
# network (only `lo`, with an address of its own: nothing leaves the machine), one host
# allowed with --allow-net answers through the sandbox's egress proxy while everything else is
# refused.
#
# Usage: scripts/demo.sh [BIN]. Without BIN, the release binary is built (`$CARGO build
# --release`) and found where cargo says it put it, CARGO_TARGET_DIR and all.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ge 1 ]; then
  BIN=$(realpath "$1")
else
  echo "== building the release binary"
  # cargo's JSON messages name the executable wherever the target directory is.
  BIN=$("${CARGO:-cargo}" build --release --bin openshell-sandbox \
          --message-format=json-render-diagnostics | python3 -c '
import json, sys
exe = ""
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "openshell-sandbox" and m.get("executable"):
        exe = m["executable"]
print(exe)')
  [ -n "$BIN" ] || { echo "cargo built no openshell-sandbox executable" >&2; exit 1; }
fi
[ -x "$BIN" ] || { echo "$BIN: not an executable" >&2; exit 1; }

WD=$(mktemp -d "${TMPDIR:-/tmp}/openshell-demo.XXXXXX")
SERVERS=()
cleanup() {
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WD"
}
trap cleanup EXIT
mkdir "$WD/work"
cd "$WD/work"

# A tiny HTTP server: `serve.py HOST PORTFILE` binds HOST on a free port, writes the port to
# PORTFILE, and answers every GET with 200 "hello from HOST".
cat > "$WD/serve.py" <<'PY'
import http.server, socketserver, sys
host, portfile = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from %s\n" % host).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = socketserver.TCPServer((host, 0), H)
open(portfile + ".tmp", "w").write(str(srv.server_address[1]))
__import__("os").rename(portfile + ".tmp", portfile)
srv.serve_forever()
PY
wait_port() { for _ in $(seq 100); do [ -s "$1" ] && { cat "$1"; return; }; sleep 0.05; done; echo "no server" >&2; exit 1; }

flags=()
echo "== openshell-sandbox check"
"$BIN" check --workdir "$WD/work" >/dev/null || { flags+=(--allow-degraded); echo "(not every layer can be enforced here: running with --allow-degraded, as check reports)"; }
[ "$(id -u)" = 0 ] || echo "(not root: the command keeps your uid; Landlock, seccomp and the namespaces still apply)"

# 1. The machine's loopback: a listener of ours, reachable outside the sandbox.
python3 "$WD/serve.py" 127.0.0.1 "$WD/port.lo" & SERVERS+=($!)
LO_PORT=$(wait_port "$WD/port.lo")
if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$LO_PORT/', timeout=5)"; then
  echo "outside the sandbox: http://127.0.0.1:$LO_PORT/ answers"
else
  echo "outside the sandbox: http://127.0.0.1:$LO_PORT/ does not answer (unexpected)"
fi

cat > demo.py <<'PY'
import errno, os, socket, sys, urllib.request
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) and e.errno else repr(e)
lo_port = int(sys.argv[1])
print("normal work:      sum(range(10**6)) =", sum(range(10**6)))
open("result.txt", "w").write("written inside the workdir\n")
print("workdir write:    ok ->", open("result.txt").read().strip())
try:
    open("/etc/evil", "w")
    print("outside write:    ALLOWED (bad)")
except OSError as e:
    print("outside write:    refused,", err(e))
try:
    socket.create_connection(("127.0.0.1", lo_port), timeout=5)
    print("host loopback:    ALLOWED (bad)")
except OSError as e:
    print("host loopback:    refused,", err(e), "(the sandbox has a loopback of its own)")
print("running as uid", os.getuid(), "with HOME", os.environ.get("HOME"))
PY
echo
echo "== openshell-sandbox run -- python3 demo.py"
"$BIN" run "${flags[@]}" -v --timeout 30 -- python3 demo.py "$LO_PORT"

# 2. One allowed host. It lives in a network namespace of its own that stands for the
# network, so that nothing leaves the machine: only `lo` there, with the address 10.77.0.10,
# and no route anywhere else (checked before anything is sent). The supervisor runs in it too,
# and its egress proxy dials from there.
echo
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
  echo "== allowed host: skipped (needs root, unshare and ip to make a network namespace standing for the network)"
  exit 0
fi
cat > net.py <<'PY'
import errno, socket, sys, urllib.error, urllib.request
port = int(sys.argv[1])
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return "%d %s" % (r.status, r.read().decode().strip())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip()[:80])
    except OSError as e:
        return "refused, " + errno.errorcode.get(e.errno, str(e))
print("allowed host:     http://10.77.0.10:%d/ ->" % port, get("http://10.77.0.10:%d/" % port))
print("other port:       http://10.77.0.10:9/ ->", get("http://10.77.0.10:9/"))
try:
    socket.create_connection(("10.77.0.10", port), timeout=5)
    print("direct connect:   ALLOWED (bad)")
except OSError as e:
    print("direct connect:   refused,", errno.errorcode.get(e.errno, e.errno), "(no proxy, no route)")
PY
echo "== in a network namespace standing for the network: openshell-sandbox run --allow-net 10.77.0.10:PORT -- python3 net.py"
unshare --net -- bash -euo pipefail -c '
  ip link set lo up
  ip addr add 10.77.0.10/32 dev lo
  # Only lo, and no route but its own: nothing can leave this namespace.
  links=$(ip -o link show | cut -d: -f2 | tr -d " ")
  [ "$links" = lo ] || { echo "unexpected interfaces: $links" >&2; exit 1; }
  [ -z "$(ip -4 route show table main)" ] || { echo "unexpected routes" >&2; exit 1; }
  python3 "$1/serve.py" 10.77.0.10 "$1/port.net" & srv=$!
  trap "kill $srv 2>/dev/null || true" EXIT
  for _ in $(seq 100); do [ -s "$1/port.net" ] && break; sleep 0.05; done
  port=$(cat "$1/port.net")
  "$2" run $3 -q --timeout 30 --allow-net "10.77.0.10:$port" -- python3 net.py "$port"
' demo "$WD" "$BIN" "${flags[*]}"
