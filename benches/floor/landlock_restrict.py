"""The cost of landlock_restrict_self by the number of rules in the ruleset (BENCHMARKS.md,
spawn session 9): a ruleset with N path rules on N directories of the current directory, then
restrict_self timed in 30 forked children, median. Run in an empty scratch directory:
`mkdir /tmp/ll && cd /tmp/ll && python3 .../benches/floor/landlock_restrict.py`."""
import ctypes, os, time, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_create, SYS_add, SYS_restrict = 444, 445, 446
attr = struct.pack("QQQ", (1<<16)-1, 0, 0)
buf = ctypes.create_string_buffer(attr, len(attr))
def ruleset(n):
    fd = libc.syscall(SYS_create, buf, ctypes.c_size_t(24), 0)
    assert fd >= 0, ctypes.get_errno()
    for i in range(n):
        d = f"d{i}"
        os.makedirs(d, exist_ok=True)
        pfd = os.open(d, os.O_PATH)
        pa = ctypes.create_string_buffer(struct.pack("=Qi", 1<<3, pfd), 12)
        r = libc.syscall(SYS_add, fd, 1, pa, 0)
        assert r == 0, ctypes.get_errno()
        os.close(pfd)
    return fd
libc.prctl(38, 1, 0, 0, 0)  # no_new_privs
for n in [20, 400, 2000, 10000]:
    fd = ruleset(n)
    ts = []
    for k in range(30):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            t = time.perf_counter_ns()
            rc = libc.syscall(SYS_restrict, fd, 0)
            d = time.perf_counter_ns() - t
            os.write(w, struct.pack("q", d if rc == 0 else -1)); os._exit(0)
        os.waitpid(pid, 0)
        ts.append(struct.unpack("q", os.read(r, 8))[0]); os.close(r); os.close(w)
    ts.sort(); print(n, "rules: restrict_self median", ts[15]/1e3, "us")
    os.close(fd)
