/*
 * Scheduling, I/O priority and resource limits of *other* processes of the same uid. The kernel
 * allows all of these between processes of one uid, so without the seccomp filter a run could
 * starve, pin or kill another run, or lower its own supervisor's RLIMIT_NOFILE (the kill sweep
 * then cannot open /proc) or RLIMIT_CPU (the supervisor dies).
 * Parameters:
 *   sup       the supervisor's pid
 *   witness   a process outside the sandbox of the sandbox's own uid
 *   harm=1    set the values a real attack would (nice 19, SCHED_IDLE, CPU 0 only, idle I/O,
 *             RLIMIT_NOFILE 4); without it every set writes the target's current value back,
 *             so an attempt that gets through changes nothing (the `all` runs aim at the
 *             supervisor and at a witness that must keep working)
 * The controls aim at the caller itself (pid or who 0), which must keep working.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "probe.h"

#define IOPRIO_WHO_PROCESS 1
#define IOPRIO_WHO_PGRP 2
#define IOPRIO_WHO_USER 3
#define IOPRIO_CLASS_IDLE 3
#define IOPRIO_CLASS_SHIFT 13

/* include/uapi/linux/sched/types.h, the first version (48 bytes). */
struct sched_attr_v0 {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
};

static int harm(void)
{
    return param_long("harm", 0) == 1;
}

static int pid_param(struct result *r, const char *key)
{
    long pid = param_long(key, 0);
    if (pid <= 1) {
        set_result(r, ERROR, 0, "parameter %s missing", key);
        return 0;
    }
    return (int)pid;
}

/* ---- setpriority ---------------------------------------------------------------------- */

static void renice(struct result *r, int which, int who, const char *what)
{
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, 0);
    if (who) {
        errno = 0;
        cur = getpriority(which, who);
        if (cur == -1 && errno) {
            set_result(r, ERROR, errno, "getpriority of the target");
            return;
        }
    }
    expect_fail(r, setpriority(which, who, harm() ? 19 : cur), what);
}

static void setpriority_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        renice(r, PRIO_PROCESS, pid, "setpriority(PRIO_PROCESS, witness)");
}

/* who = 0 with PRIO_USER is every process of the caller's uid, the witness included. */
static void setpriority_prio_user(struct result *r)
{
    renice(r, PRIO_USER, 0, "setpriority(PRIO_USER, 0)");
}

static void setpriority_prio_pgrp(struct result *r)
{
    renice(r, PRIO_PGRP, 0, "setpriority(PRIO_PGRP, 0)");
}

static void control_setpriority_self(struct result *r)
{
    expect_fail(r, setpriority(PRIO_PROCESS, 0, 10), "setpriority(PRIO_PROCESS, 0, 10)");
}

/* ---- affinity ------------------------------------------------------------------------- */

static void affinity(struct result *r, int pid, const char *what)
{
    cpu_set_t set;
    if (sched_getaffinity(pid, sizeof set, &set) != 0) {
        set_result(r, ERROR, errno, "sched_getaffinity of the target");
        return;
    }
    if (harm()) {
        CPU_ZERO(&set);
        CPU_SET(0, &set);
    }
    expect_fail(r, sched_setaffinity(pid, sizeof set, &set), what);
}

static void sched_setaffinity_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        affinity(r, pid, "sched_setaffinity(witness)");
}

static void control_sched_setaffinity_self(struct result *r)
{
    affinity(r, 0, "sched_setaffinity(0)");
}

/* ---- scheduling policy ---------------------------------------------------------------- */

static void scheduler(struct result *r, int pid, int policy, const char *what)
{
    struct sched_param p = {0};
    expect_fail(r, sched_setscheduler(pid, policy, &p), what);
}

static void sched_setscheduler_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        scheduler(r, pid, harm() ? SCHED_IDLE : SCHED_OTHER, "sched_setscheduler(witness)");
}

static void control_sched_setscheduler_self(struct result *r)
{
    scheduler(r, 0, SCHED_IDLE, "sched_setscheduler(0, SCHED_IDLE)");
}

static void sched_setparam_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (!pid)
        return;
    struct sched_param p = {0};
    expect_fail(r, sched_setparam(pid, &p), "sched_setparam(witness)");
}

static void control_sched_setparam_self(struct result *r)
{
    struct sched_param p = {0};
    expect_fail(r, sched_setparam(0, &p), "sched_setparam(0)");
}

static void setattr(struct result *r, int pid, const char *what)
{
    struct sched_attr_v0 a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.sched_policy = harm() ? SCHED_IDLE : SCHED_OTHER;
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, (id_t)pid);
    if (cur == -1 && errno) {
        set_result(r, ERROR, errno, "getpriority of the target");
        return;
    }
    a.sched_nice = harm() ? 19 : cur;
    expect_fail(r, syscall(SYS_sched_setattr, pid, &a, 0), what);
}

static void sched_setattr_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        setattr(r, pid, "sched_setattr(witness)");
}

static void control_sched_setattr_self(struct result *r)
{
    setattr(r, 0, "sched_setattr(0)");
}

/* ---- I/O priority --------------------------------------------------------------------- */

static void io_prio(struct result *r, int which, int who, const char *what)
{
    long cur = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, which == IOPRIO_WHO_PROCESS ? who : 0);
    if (cur < 0) {
        set_result(r, ERROR, errno, "ioprio_get of the target");
        return;
    }
    long prio = harm() ? IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT : cur;
    expect_fail(r, syscall(SYS_ioprio_set, which, who, prio), what);
}

static void ioprio_set_witness(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        io_prio(r, IOPRIO_WHO_PROCESS, pid, "ioprio_set(WHO_PROCESS, witness)");
}

/* who = the caller's uid, not 0: this kernel answered who = 0 with EPERM on its own. The
 * filter refuses every `which` but IOPRIO_WHO_PROCESS whatever `who` is. */
static void ioprio_set_who_user(struct result *r)
{
    io_prio(r, IOPRIO_WHO_USER, (int)getuid(), "ioprio_set(WHO_USER, getuid())");
}

static void ioprio_set_who_pgrp(struct result *r)
{
    io_prio(r, IOPRIO_WHO_PGRP, 0, "ioprio_set(WHO_PGRP, 0)");
}

static void control_ioprio_set_self(struct result *r)
{
    long prio = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
    expect_fail(r, syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio),
                "ioprio_set(WHO_PROCESS, 0, idle)");
}

/* ---- resource limits ------------------------------------------------------------------ */

/* Write the target's own limit back (or 4 under harm=1): a change only under harm=1. A target
 * whose limits we cannot read gets our own, which the kernel refuses on the same check. */
static void lower_limit(struct result *r, int pid, int resource, const char *what)
{
    struct rlimit cur;
    if (prlimit(pid, resource, NULL, &cur) != 0 && prlimit(0, resource, NULL, &cur) != 0) {
        set_result(r, ERROR, errno, "prlimit read");
        return;
    }
    if (harm() && resource == RLIMIT_NOFILE)
        cur.rlim_cur = cur.rlim_max = 4;
    expect_fail(r, prlimit(pid, resource, &cur, NULL), what);
}

static void prlimit_supervisor_nofile(struct result *r)
{
    int pid = pid_param(r, "sup");
    if (pid)
        lower_limit(r, pid, RLIMIT_NOFILE, "prlimit64(sup, NOFILE, new)");
}

static void prlimit_supervisor_cpu(struct result *r)
{
    int pid = pid_param(r, "sup");
    if (pid)
        lower_limit(r, pid, RLIMIT_CPU, "prlimit64(sup, CPU, new)");
}

static void prlimit_witness_nofile(struct result *r)
{
    int pid = pid_param(r, "witness");
    if (pid)
        lower_limit(r, pid, RLIMIT_NOFILE, "prlimit64(witness, NOFILE, new)");
}

static void read_limit(struct result *r, const char *key)
{
    int pid = pid_param(r, key);
    if (!pid)
        return;
    struct rlimit cur;
    if (prlimit(pid, RLIMIT_NOFILE, NULL, &cur) != 0)
        set_result(r, BLOCKED, errno, "prlimit64(%s, NOFILE, NULL, old)", key);
    else
        set_result(r, ALLOWED, 0, "prlimit64(%s, NOFILE, NULL, old): %llu", key,
                   (unsigned long long)cur.rlim_cur);
}

static void control_prlimit_read_supervisor(struct result *r)
{
    read_limit(r, "sup");
}

static void control_prlimit_read_witness(struct result *r)
{
    read_limit(r, "witness");
}

/* setrlimit(3) itself: glibc calls prlimit64(0, resource, new, NULL). */
static void control_prlimit_set_self(struct result *r)
{
    struct rlimit cur;
    if (getrlimit(RLIMIT_NOFILE, &cur) != 0) {
        set_result(r, ERROR, errno, "getrlimit");
        return;
    }
    cur.rlim_cur = cur.rlim_cur > 64 ? 64 : cur.rlim_cur;
    expect_fail(r, prlimit(0, RLIMIT_NOFILE, &cur, NULL), "prlimit64(0, NOFILE, new)");
}

const struct attempt SCHED_ATTEMPTS[] = {
    ATTEMPT("sched", prlimit_supervisor_nofile),
    ATTEMPT("sched", prlimit_supervisor_cpu),
    ATTEMPT("sched", control_prlimit_read_supervisor),
    ATTEMPT("sched", prlimit_witness_nofile),
    ATTEMPT("sched", control_prlimit_read_witness),
    ATTEMPT("sched", control_prlimit_set_self),
    ATTEMPT("sched", setpriority_witness),
    ATTEMPT("sched", control_setpriority_self),
    ATTEMPT("sched", sched_setaffinity_witness),
    ATTEMPT("sched", control_sched_setaffinity_self),
    ATTEMPT("sched", sched_setscheduler_witness),
    ATTEMPT("sched", control_sched_setscheduler_self),
    ATTEMPT("sched", sched_setparam_witness),
    ATTEMPT("sched", control_sched_setparam_self),
    ATTEMPT("sched", sched_setattr_witness),
    ATTEMPT("sched", control_sched_setattr_self),
    ATTEMPT("sched", ioprio_set_witness),
    ATTEMPT("sched", control_ioprio_set_self),
    {0},
};

/* Aimed at every process of the caller's uid or process group: run only by name, by a test
 * that gives the run a uid of its own (under `--uid 0`, PRIO_USER would be every root process
 * of the machine if it got through). */
const struct attempt SCHED_BY_NAME[] = {
    ATTEMPT("sched", setpriority_prio_user),
    ATTEMPT("sched", setpriority_prio_pgrp),
    ATTEMPT("sched", ioprio_set_who_user),
    ATTEMPT("sched", ioprio_set_who_pgrp),
    {0},
};
