# A hostile WebSocket client for tests/egress_websocket_limits.rs, run inside the sandbox:
# raw frames on the wire (no library between the test and the proxy). Each mode prints what
# came back: `close:<code>`, `text:<payload>` (or `text-len:<n>`), `eof`, and timings in ms.
import os, select, socket, struct, sys, time

PROXY = ("10.200.0.1", 3128)
ZERO = b"\0\0\0\0"  # a mask key of zeros: the payload goes as it is


def session(host="ws.test", path="/rt/x"):
    s = socket.create_connection(PROXY)
    s.sendall(b"CONNECT %s:8180 HTTP/1.1\r\nHost: %s:8180\r\n\r\n" % (host.encode(), host.encode()))
    f = s.makefile("rb")
    line = f.readline()
    assert line.startswith(b"HTTP/1.1 200"), line
    while f.readline() not in (b"\r\n", b""):
        pass
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s:8180\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
               % (path, host)).encode())
    line = f.readline()
    assert b" 101 " in line, line
    while f.readline() not in (b"\r\n", b""):
        pass
    return s, f


def header(op, n, fin=True):
    b0 = (0x80 if fin else 0) | op
    if n < 126:
        h = bytes([b0, 0x80 | n])
    elif n < 65536:
        h = bytes([b0, 0x80 | 126]) + struct.pack(">H", n)
    else:
        h = bytes([b0, 0x80 | 127]) + struct.pack(">Q", n)
    return h + ZERO


def frame(op, payload, fin=True):
    return header(op, len(payload), fin) + payload


def read_frame(f):
    try:
        h = f.read(2)
    except ConnectionResetError:
        return "reset"
    if len(h) < 2:
        return "eof"
    n = h[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    p = f.read(n)
    op = h[0] & 0x0F
    if op == 8:
        return "close:%d" % struct.unpack(">H", p[:2])[0]
    if op == 1:
        return "text:" + p.decode() if n < 64 else "text-len:%d" % n
    return "op%d:%d" % (op, n)


def ms(t):
    return int((time.monotonic() - t) * 1000)


def main():
    mode = sys.argv[1]
    if mode == "toobig-text":
        s, f = session()
        s.sendall(header(1, (4 << 20) + 1))
        print(mode, read_frame(f), flush=True)
    elif mode == "toobig-frame":
        s, f = session()
        s.sendall(header(2, (16 << 20) + 1))
        print(mode, read_frame(f), flush=True)
    elif mode == "fragments":
        # 4096 fragments pass; the 4097th of the next message closes the session.
        s, f = session()
        for n in (4096, 4097):
            out = frame(1, b"a", fin=False) + frame(0, b"a", fin=False) * (n - 2) + frame(0, b"a")
            s.sendall(out)
            print(mode, n, read_frame(f), flush=True)
    elif mode == "assembly-idle":
        s, f = session()
        s.sendall(frame(1, b"a", fin=False))
        t = time.monotonic()
        print(mode, read_frame(f), ms(t), flush=True)
    elif mode == "assembly-total":
        # A fragment every 200 ms (the idle clock never runs out) until the proxy closes.
        s, f = session()
        s.sendall(frame(1, b"a", fin=False))
        t = time.monotonic()
        sent = 1
        while not select.select([s], [], [], 0.2)[0]:
            s.sendall(frame(0, b"a", fin=False))
            sent += 1
        print(mode, read_frame(f), ms(t), sent, flush=True)
    elif mode == "relay-idle":
        s, f = session()
        s.sendall(frame(1, b"hi"))
        print(mode, read_frame(f), flush=True)
        t = time.monotonic()
        print(mode, read_frame(f), ms(t), flush=True)
    elif mode == "raw-idle":
        # A `rest` endpoint: after the 101 the bytes go raw, still under the idle clock.
        s, f = session(host="s.test", path="/raw")
        s.sendall(frame(1, b"hi"))
        print(mode, read_frame(f), flush=True)
        t = time.monotonic()
        print(mode, read_frame(f), ms(t), flush=True)
    elif mode == "capacity":
        n = int(sys.argv[2])
        socks = [session() for _ in range(n)]
        for s, _ in socks:
            s.sendall(frame(1, b"a", fin=False))
            time.sleep(0.005)
        time.sleep(1.0)
        closed = [i for i, (s, _) in enumerate(socks) if select.select([s], [], [], 0)[0]]
        print(mode, "closed", len(closed), [read_frame(socks[i][1]) for i in closed], flush=True)
        # The rest are still open and still assembling: finish one, it goes through.
        open_ = [i for i in range(n) if i not in closed]
        s, f = socks[open_[0]]
        s.sendall(frame(0, b"b"))
        print(mode, "first", read_frame(f), flush=True)
        for s, f in socks:
            f.close()
            s.close()
        time.sleep(0.5)
        s, f = session()
        s.sendall(frame(1, b"again"))
        print(mode, "after", read_frame(f), flush=True)
    elif mode == "flood":
        # Every session sends half of a 16 MiB binary frame before any sends the rest.
        n = int(sys.argv[2])
        size = 16 << 20
        payload = bytes(range(256)) * (size // 256)
        socks = [session() for _ in range(n)]
        for s, _ in socks:
            s.sendall(header(2, size) + payload[: size // 2])
        for s, _ in socks:
            s.sendall(payload[size // 2 :])
        # A text behind each: its echo says the frame went through whole.
        for s, _ in socks:
            s.sendall(frame(1, b"done"))
        print(mode, sorted(set(read_frame(f) for _, f in socks)), flush=True)
    else:
        sys.exit("unknown mode " + mode)


main()
