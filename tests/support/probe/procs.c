/*
 * Reaching other processes. Parameters:
 *   sup       the supervisor's pid (checked against getppid)
 *   witness   a process outside the sandbox running as the sandbox's own uid, dumpable, that
 *             counts the signals it receives; the test asks it afterwards
 *   outside_file  a file outside every grant
 * The witness is the hard case: same uid, so only Landlock's ptrace rule and its signal scope
 * stand in the way. The supervisor adds non-dumpable on top.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

static int target_pid(struct result *r, const char *key)
{
    long pid = param_long(key, 0);
    if (pid <= 1) {
        set_result(r, ERROR, 0, "parameter %s missing", key);
        return 0;
    }
    return (int)pid;
}

static void open_proc_file(struct result *r, const char *key, const char *file, int flags)
{
    int pid = target_pid(r, key);
    if (!pid)
        return;
    char p[128];
    snprintf(p, sizeof p, "/proc/%d/%s", pid, file);
    int fd = open(p, flags | O_CLOEXEC);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "open %s", p);
        return;
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    set_result(r, ALLOWED, 0, "opened %s, read returned %zd", p, n);
}

static void control_supervisor_is_parent(struct result *r)
{
    int pid = target_pid(r, "sup");
    if (!pid)
        return;
    /* Not an escape: checks that the attempts below aim at the right process. */
    if (probe_parent == pid)
        set_result(r, ALLOWED, 0, "the probe's parent is sup == %d", pid);
    else
        set_result(r, ERROR, 0, "the probe's parent %d != sup %d", probe_parent, pid);
}

static void read_supervisor_environ(struct result *r)
{
    open_proc_file(r, "sup", "environ", O_RDONLY);
}

static void open_supervisor_mem(struct result *r)
{
    open_proc_file(r, "sup", "mem", O_RDONLY);
}

static void read_witness_environ(struct result *r)
{
    open_proc_file(r, "witness", "environ", O_RDONLY);
}

static void open_witness_mem(struct result *r)
{
    open_proc_file(r, "witness", "mem", O_RDWR);
}

static void read_via_witness_root(struct result *r)
{
    NEED(r, outside_file);
    char f[512];
    snprintf(f, sizeof f, "root%s", outside_file);
    open_proc_file(r, "witness", f, O_RDONLY);
}

static void ptrace_attach(struct result *r, const char *key)
{
    int pid = target_pid(r, key);
    if (!pid)
        return;
    long rc = ptrace(PTRACE_ATTACH, pid, 0, 0);
    expect_fail(r, rc, "PTRACE_ATTACH");
    if (rc == 0) {
        /* Let the target stop, then release it, or it stays stopped after we exit. */
        waitpid(pid, NULL, __WALL);
        ptrace(PTRACE_DETACH, pid, 0, 0);
    }
}

static void ptrace_attach_supervisor(struct result *r)
{
    ptrace_attach(r, "sup");
}

static void ptrace_attach_witness(struct result *r)
{
    ptrace_attach(r, "witness");
}

static void ptrace_traceme(struct result *r)
{
    /* Always allowed by the kernel itself: EPERM can only come from seccomp. */
    expect_fail(r, ptrace(PTRACE_TRACEME, 0, 0, 0), "PTRACE_TRACEME");
}

static void process_vm_readv_supervisor(struct result *r)
{
    int pid = target_pid(r, "sup");
    if (!pid)
        return;
    char buf[16];
    /* Any address will do: the filter answers before the kernel looks at it. */
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    expect_fail(r, process_vm_readv(pid, &local, 1, &remote, 1, 0), "process_vm_readv");
}

static void pidfd_getfd_supervisor(struct result *r)
{
    int pid = target_pid(r, "sup");
    if (!pid)
        return;
    long pfd = syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0) {
        set_result(r, BLOCKED, errno, "pidfd_open");
        return;
    }
    expect_fail(r, syscall(SYS_pidfd_getfd, pfd, 0, 0), "pidfd_getfd(sup, 0)");
}

/* A permission probe first (signal 0); only a refused probe is followed by the real signal,
 * so an unexpected success reports itself instead of killing the run. */
static void kill_checked(struct result *r, int pid, int sig, const char *what)
{
    if (kill(pid, 0) == 0) {
        set_result(r, ALLOWED, 0, "kill(%d, 0) succeeded: %s can be signalled", pid, what);
        return;
    }
    expect_fail(r, kill(pid, sig), what);
}

static void kill_supervisor(struct result *r)
{
    int pid = target_pid(r, "sup");
    if (pid)
        kill_checked(r, pid, SIGKILL, "kill(sup, SIGKILL)");
}

static void kill_init(struct result *r)
{
    kill_checked(r, 1, SIGKILL, "kill(1, SIGKILL)");
}

static void kill_witness(struct result *r)
{
    int pid = target_pid(r, "witness");
    if (pid)
        expect_fail(r, kill(pid, SIGUSR1), "kill(witness, SIGUSR1)");
}

static void pidfd_send_signal_witness(struct result *r)
{
    int pid = target_pid(r, "witness");
    if (!pid)
        return;
    long pfd = syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0) {
        set_result(r, BLOCKED, errno, "pidfd_open");
        return;
    }
    /* Not SIGUSR1 as kill_witness sends: two pending standard signals of one number merge
     * into one when the witness is not scheduled in between, and the bare control run then
     * counted one where two got through. */
    expect_fail(r, syscall(SYS_pidfd_send_signal, pfd, SIGURG, NULL, 0),
                "pidfd_send_signal(witness, SIGURG)");
}

/*
 * F_SETOWN + O_ASYNC makes the kernel itself signal the owner when I/O is ready, and F_SETSIG
 * chooses the signal. No syscall here fails when the scope works: the kernel drops the signal.
 * Only the witness can tell, so the outcome is pending.
 */
static void sigio_to_witness(struct result *r)
{
    int pid = target_pid(r, "witness");
    if (!pid)
        return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        set_result(r, ERROR, errno, "socketpair");
        return;
    }
    if (fcntl(sv[0], F_SETOWN, pid) != 0) {
        set_result(r, BLOCKED, errno, "F_SETOWN witness");
        return;
    }
    if (fcntl(sv[0], F_SETSIG, SIGUSR2) != 0 ||
        fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_ASYNC) != 0) {
        set_result(r, ERROR, errno, "F_SETSIG / O_ASYNC");
        return;
    }
    if (write(sv[1], "x", 1) != 1) {
        set_result(r, ERROR, errno, "write to trigger SIGIO");
        return;
    }
    set_result(r, PENDING, 0, "SIGUSR2 queued to the witness via SIGIO; ask the witness");
}

const struct attempt PROC_ATTEMPTS[] = {
    ATTEMPT("procs", control_supervisor_is_parent),
    ATTEMPT("procs", read_supervisor_environ),
    ATTEMPT("procs", open_supervisor_mem),
    ATTEMPT("procs", read_witness_environ),
    ATTEMPT("procs", open_witness_mem),
    ATTEMPT("procs", read_via_witness_root),
    ATTEMPT("procs", ptrace_attach_supervisor),
    ATTEMPT("procs", ptrace_attach_witness),
    ATTEMPT("procs", ptrace_traceme),
    ATTEMPT("procs", process_vm_readv_supervisor),
    ATTEMPT("procs", pidfd_getfd_supervisor),
    ATTEMPT("procs", kill_witness),
    ATTEMPT("procs", pidfd_send_signal_witness),
    ATTEMPT("procs", sigio_to_witness),
    ATTEMPT("procs", kill_init),
    /* Last: if it worked, nothing after it would be reported. */
    ATTEMPT("procs", kill_supervisor),
    {0},
};
