/*
 * The adversarial probe: run *inside* `openshell-sandbox run`, it attempts one known escape
 * after another and prints one JSON line per attempt:
 *
 *   {"name":"...","group":"...","outcome":"allowed|blocked|contained|pending|error",
 *    "errno":N|null,"errno_name":"E..."|null,"signal":N|null,"detail":"..."}
 *
 * Every attempt runs in its own forked child, so a crash (or a seccomp kill) ends only that
 * attempt. The probe judges only what it can see from inside; the test that runs it checks
 * the effects outside (the witness saw no signal, the daemon is gone, the socket saw no peer)
 * and holds the expected errno of each attempt.
 *
 * Wherever the kernel would answer differently without the sandbox, the attempt is built so
 * that the sandbox's answer is distinguishable: add_key and PTRACE_TRACEME succeed for any
 * process, setns(-1) is EBADF, TIOCSTI on /dev/null is ENOTTY. The stand-in secrets are owned
 * by the sandbox uid, so only Landlock stands between them and the child.
 *
 * Usage: probe MODE [key=value ...]
 *   all       every attempt of the ATTEMPTS table (each takes milliseconds)
 *   NAME      one attempt of ATTEMPTS or BOMBS by name; the bombs need their own limits, so
 *             they only run this way (as do the attempts of SCHED_BY_NAME and HOST_BY_NAME);
 *             several names may be given, separated by commas
 *   witness   not a probe: a process outside the sandbox that counts the signals it receives
 *   killuid   not a probe: the test's cleanup, SIGKILL to every process of the calling uid
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

/* ---- parameters ------------------------------------------------------------------------ */

static int nparams;
static char *pkeys[64], *pvals[64];

const char *param(const char *key)
{
    for (int i = 0; i < nparams; i++)
        if (strcmp(pkeys[i], key) == 0)
            return pvals[i];
    return NULL;
}

long param_long(const char *key, long dflt)
{
    const char *v = param(key);
    return v ? strtol(v, NULL, 0) : dflt;
}

const char *path_in(char *buf, unsigned long n, const char *dir_param, const char *name)
{
    const char *d = param(dir_param);
    snprintf(buf, n, "%s/%s", d ? d : "/nonexistent-param", name);
    return buf;
}

/* ---- results --------------------------------------------------------------------------- */

void set_result(struct result *r, enum outcome o, int err, const char *fmt, ...)
{
    r->outcome = o;
    r->err = err;
    r->detail[0] = 0;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->detail, sizeof r->detail, fmt, ap);
        va_end(ap);
    }
}

/* A call that must fail: -1 is blocked (with its errno), anything else is allowed. */
void expect_fail(struct result *r, long rc, const char *what)
{
    if (rc == -1)
        set_result(r, BLOCKED, errno, "%s", what);
    else
        set_result(r, ALLOWED, 0, "%s returned %ld", what, rc);
}

static const char *outcome_name(enum outcome o)
{
    switch (o) {
    case ALLOWED:
        return "allowed";
    case BLOCKED:
        return "blocked";
    case CONTAINED:
        return "contained";
    case PENDING:
        return "pending";
    default:
        return "error";
    }
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void emit(const char *group, const char *name, const struct result *r, int sig)
{
    printf("{\"name\":");
    json_str(name);
    printf(",\"group\":");
    json_str(group);
    printf(",\"outcome\":\"%s\",\"errno\":", outcome_name(r->outcome));
    if (r->err) {
        printf("%d,\"errno_name\":", r->err);
        json_str(strerrorname_np(r->err) ? strerrorname_np(r->err) : "?");
    } else {
        printf("null,\"errno_name\":null");
    }
    if (sig)
        printf(",\"signal\":%d", sig);
    else
        printf(",\"signal\":null");
    printf(",\"detail\":");
    json_str(r->detail);
    printf("}\n");
    fflush(stdout);
}

/*
 * Run one attempt in a forked child that sends its result back through a pipe. A child that
 * dies without answering reports how it died: SIGSYS is seccomp's kill (blocked); SIGKILL,
 * SIGXFSZ and SIGXCPU are resource limits doing their job (contained).
 */
static void run_attempt(const struct attempt *a)
{
    int p[2];
    struct result r;
    memset(&r, 0, sizeof r);
    if (pipe2(p, O_CLOEXEC) != 0) {
        set_result(&r, ERROR, errno, "pipe2 for the attempt");
        emit(a->group, a->name, &r, 0);
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        set_result(&r, ERROR, errno, "fork for the attempt");
        emit(a->group, a->name, &r, 0);
        close(p[0]);
        close(p[1]);
        return;
    }
    if (pid == 0) {
        close(p[0]);
        struct result cr;
        memset(&cr, 0, sizeof cr);
        set_result(&cr, ERROR, 0, "attempt returned no result");
        a->fn(&cr);
        ssize_t w = write(p[1], &cr, sizeof cr);
        _exit(w == (ssize_t)sizeof cr ? 0 : 1);
    }
    close(p[1]);
    ssize_t n = read(p[0], &r, sizeof r);
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    if (n != (ssize_t)sizeof r) {
        if (sig == SIGSYS)
            set_result(&r, BLOCKED, 0, "killed by SIGSYS (seccomp)");
        else if (sig == SIGKILL || sig == SIGXFSZ || sig == SIGXCPU)
            set_result(&r, CONTAINED, 0, "killed by signal %d", sig);
        else
            set_result(&r, ERROR, 0, "attempt died (status %#x) without a result", st);
    }
    emit(a->group, a->name, &r, sig);
}

/* ---- main ------------------------------------------------------------------------------ */

/* Is `name` one of the comma-separated names of `list`? */
static int name_listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchrnul(p, ',');
        if ((size_t)(end - p) == n && strncmp(p, name, n) == 0)
            return 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

pid_t probe_parent;

int main(int argc, char **argv)
{
    /* Before anything else opens a descriptor: what did we inherit? */
    count_inherited_fds();
    /* The attempts run in forked children, whose parent is us. */
    probe_parent = getppid();
    if (argc < 2) {
        fprintf(stderr, "usage: probe MODE [key=value ...]\n");
        return 2;
    }
    for (int i = 2; i < argc && nparams < 64; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq)
            continue;
        *eq = 0;
        pkeys[nparams] = argv[i];
        pvals[nparams] = eq + 1;
        nparams++;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "witness") == 0)
        return witness_main();
    if (strcmp(mode, "killuid") == 0)
        return killuid_main();
    const struct attempt *tables[] = {FS_ATTEMPTS,   PROC_ATTEMPTS,  NET_ATTEMPTS, KERNEL_ATTEMPTS,
                                      PRIV_ATTEMPTS, SCHED_ATTEMPTS, BOMBS,        SCHED_BY_NAME,
                                      HOST_BY_NAME};
    int all = strcmp(mode, "all") == 0;
    int ran = 0;
    for (unsigned t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        for (const struct attempt *a = tables[t]; a->name; a++) {
            int by_name_only =
                tables[t] == BOMBS || tables[t] == SCHED_BY_NAME || tables[t] == HOST_BY_NAME;
            if ((all && !by_name_only) || name_listed(mode, a->name)) {
                run_attempt(a);
                ran++;
            }
        }
    }
    if (!ran) {
        fprintf(stderr, "probe: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
