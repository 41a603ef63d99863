/*
 * Privilege, the syscall ABI, and leaks. Parameters:
 *   setuid   a root-owned mode-4755 helper that prints "euid=N"; the test proves outside the
 *            sandbox that the bit works on that filesystem
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

extern char **environ;

static int inherited_fds = -1;
static char inherited_list[200];

void count_inherited_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int self = dirfd(d), n = 0;
    size_t used = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd <= 2 || fd == self)
            continue;
        n++;
        char target[64] = "";
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t t = readlink(link, target, sizeof target - 1);
        target[t > 0 ? t : 0] = 0;
        if (used < sizeof inherited_list)
            used += (size_t)snprintf(inherited_list + used, sizeof inherited_list - used,
                                     "%d->%s ", fd, target);
    }
    closedir(d);
    inherited_fds = n;
}

static void raise_limit(struct result *r, int resource, const char *what)
{
    struct rlimit l;
    getrlimit(resource, &l);
    if (l.rlim_max == RLIM_INFINITY) {
        set_result(r, ERROR, 0, "%s has no hard limit to raise (pass the limit flag)", what);
        return;
    }
    struct rlimit up = {l.rlim_max + 1, l.rlim_max + 1};
    expect_fail(r, setrlimit(resource, &up), what);
}

static void raise_rlimit_as(struct result *r)
{
    raise_limit(r, RLIMIT_AS, "setrlimit(AS, hard+1)");
}

static void raise_rlimit_nproc(struct result *r)
{
    raise_limit(r, RLIMIT_NPROC, "setrlimit(NPROC, hard+1)");
}

static void raise_rlimit_nofile(struct result *r)
{
    raise_limit(r, RLIMIT_NOFILE, "setrlimit(NOFILE, hard+1)");
}

static void setpriority_minus_20(struct result *r)
{
    expect_fail(r, setpriority(PRIO_PROCESS, 0, -20), "setpriority(-20)");
}

static void setuid_root(struct result *r)
{
    /* Raw, so glibc's cross-thread broadcast is not involved. */
    expect_fail(r, syscall(SYS_setresuid, 0, 0, 0), "setresuid(0, 0, 0)");
}

static void capset_full(struct result *r)
{
    struct {
        unsigned version;
        int pid;
    } hdr = {0x20080522, 0};
    unsigned data[6] = {~0u, ~0u, 0, ~0u, ~0u, 0}; /* effective, permitted, inheritable x2 */
    expect_fail(r, syscall(SYS_capset, &hdr, data), "capset(all)");
}

/* The usable sets must be empty. The bounding set only matters without no_new_privs; a
 * non-root supervisor cannot shrink it (that needs CAP_SETPCAP), so it is only reported. */
static void capabilities_held(struct result *r)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) {
        set_result(r, ERROR, errno, "open /proc/self/status");
        return;
    }
    static const char *usable[] = {"CapInh:", "CapPrm:", "CapEff:", "CapAmb:", NULL};
    char line[256], held[120] = "";
    unsigned long long bounding = 0;
    size_t used = 0;
    while (fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v)
            continue;
        unsigned long long bits = strtoull(v + 1, NULL, 16);
        if (strncmp(line, "CapBnd:", 7) == 0)
            bounding = bits;
        for (const char **u = usable; *u; u++)
            if (strncmp(line, *u, strlen(*u)) == 0 && bits && used < sizeof held)
                used += (size_t)snprintf(held + used, sizeof held - used, "%s%llx ", *u, bits);
    }
    fclose(f);
    if (used)
        set_result(r, ALLOWED, 0, "capabilities held: %s(CapBnd %llx)", held, bounding);
    else
        set_result(r, BLOCKED, 0, "effective, permitted, inheritable, ambient empty; CapBnd %llx",
                   bounding);
}

static void clear_no_new_privs(struct result *r)
{
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
        set_result(r, ALLOWED, 0, "no_new_privs is not set");
        return;
    }
    expect_fail(r, prctl(PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS, 0)");
}

static void exec_setuid_helper(struct result *r)
{
    NEED(r, setuid);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        set_result(r, ERROR, errno, "pipe2");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        char *argv[] = {(char *)setuid, NULL};
        execve(setuid, argv, environ);
        dprintf(1, "exec-errno=%d", errno);
        _exit(127);
    }
    close(p[1]);
    char out[64] = "";
    ssize_t n = read(p[0], out, sizeof out - 1);
    out[n > 0 ? n : 0] = 0;
    close(p[0]);
    waitpid(pid, NULL, 0);
    int euid = -1, err = 0;
    if (sscanf(out, "euid=%d", &euid) == 1 && euid == 0)
        set_result(r, ALLOWED, 0, "the helper ran with euid 0");
    else if (euid >= 0)
        set_result(r, BLOCKED, 0, "the helper ran with euid %d", euid);
    else if (sscanf(out, "exec-errno=%d", &err) == 1)
        set_result(r, ERROR, err, "exec of the helper failed");
    else
        set_result(r, ERROR, 0, "unexpected helper output: %s", out);
}

/* The x32 ABI: the same entry point, bit 30 set in the number. */
static void x32_syscall(struct result *r)
{
    expect_fail(r, syscall(0x40000000L | SYS_getpid), "x32 getpid");
}

/* Number -1 (0xffffffff as seccomp sees it): not a syscall on any ABI, so the kernel answers
 * ENOSYS. It has bit 30 set, but it is no x32 number: the process must survive it. */
static void syscall_minus_one(struct result *r)
{
    expect_fail(r, syscall(-1L), "syscall(-1)");
}

/* The i386 ABI through int 0x80 (eax = 20 is i386 getpid). */
static void int80_syscall(struct result *r)
{
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "cc");
    if (ret < 0 && ret > -4096)
        set_result(r, BLOCKED, (int)-ret, "int 0x80 getpid");
    else
        set_result(r, ALLOWED, 0, "int 0x80 getpid returned %ld", ret);
}

static void leak_inherited_fds(struct result *r)
{
    if (inherited_fds < 0)
        set_result(r, ERROR, 0, "could not list /proc/self/fd at startup");
    else if (inherited_fds == 0)
        set_result(r, BLOCKED, 0, "no descriptor above 2");
    else
        set_result(r, ALLOWED, 0, "%d inherited: %s", inherited_fds, inherited_list);
}

static void leak_environment(struct result *r)
{
    static const char *base[] = {"PATH=", "HOME=", "LANG=", "TMPDIR=", NULL};
    char extra[200] = "";
    size_t used = 0;
    for (char **e = environ; *e; e++) {
        int ok = 0;
        for (const char **b = base; *b; b++)
            ok |= strncmp(*e, *b, strlen(*b)) == 0;
        if (!ok && used < sizeof extra)
            used += (size_t)snprintf(extra + used, sizeof extra - used, "%.*s ",
                                     (int)strcspn(*e, "="), *e);
    }
    if (used)
        set_result(r, ALLOWED, 0, "variables beyond the minimal set: %s", extra);
    else
        set_result(r, BLOCKED, 0, "only PATH, HOME, LANG, TMPDIR");
}

const struct attempt PRIV_ATTEMPTS[] = {
    ATTEMPT("privilege", raise_rlimit_as),
    ATTEMPT("privilege", raise_rlimit_nproc),
    ATTEMPT("privilege", raise_rlimit_nofile),
    ATTEMPT("privilege", setpriority_minus_20),
    ATTEMPT("privilege", setuid_root),
    ATTEMPT("privilege", capset_full),
    ATTEMPT("privilege", capabilities_held),
    ATTEMPT("privilege", clear_no_new_privs),
    ATTEMPT("privilege", exec_setuid_helper),
    ATTEMPT("abi", x32_syscall),
    ATTEMPT("abi", int80_syscall),
    ATTEMPT("abi", syscall_minus_one),
    ATTEMPT("leaks", leak_inherited_fds),
    ATTEMPT("leaks", leak_environment),
    {0},
};
