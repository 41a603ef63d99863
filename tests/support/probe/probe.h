/* Shared declarations of the probe's files. See probe.c for what the probe is. */
#ifndef PROBE_H
#define PROBE_H

#include <sys/types.h>

enum outcome {
    /* The attempt did what it tried. For an escape, that is a finding. */
    ALLOWED,
    /* The kernel refused: an errno, or a kill by seccomp. */
    BLOCKED,
    /* A resource bomb ran into its limit. */
    CONTAINED,
    /* The effect can only be judged outside the sandbox (a daemon, a signal to the witness). */
    PENDING,
    /* The probe could not set the attempt up; never a pass. */
    ERROR,
};

struct result {
    enum outcome outcome;
    int err;
    char detail[240];
};

struct attempt {
    const char *group;
    const char *name;
    void (*fn)(struct result *);
};

/* key=value parameters from the command line; NULL / dflt when absent. */
const char *param(const char *key);
long param_long(const char *key, long dflt);

void set_result(struct result *r, enum outcome o, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void expect_fail(struct result *r, long rc, const char *what);

/* The probe's own parent, read at startup: the supervisor. */
extern pid_t probe_parent;

/* Descriptors above 2 found at startup, before the probe opened anything. */
void count_inherited_fds(void);

/* The attempt tables, one per file; each ends with a {0} entry. */
extern const struct attempt FS_ATTEMPTS[];      /* fs.c */
extern const struct attempt PROC_ATTEMPTS[];    /* procs.c */
extern const struct attempt NET_ATTEMPTS[];     /* net.c */
extern const struct attempt KERNEL_ATTEMPTS[];  /* kernel.c: namespaces, kernel surface */
extern const struct attempt PRIV_ATTEMPTS[];    /* priv.c: privilege, syscall ABI, leaks */
extern const struct attempt SCHED_ATTEMPTS[];   /* sched.c: other processes' priority, limits */
/* Attempts on every process of the uid or group (sched.c): run only by name. */
extern const struct attempt SCHED_BY_NAME[];
/* Attempts on state the host keeps after the run (host.c): run only by name. */
extern const struct attempt HOST_BY_NAME[];
/* Containment attempts (bombs.c): run only by name, each with its own limits. */
extern const struct attempt BOMBS[];

/* Named in the test's JSON and used by the tables. */
#define ATTEMPT(g, n) {g, #n, n}

int witness_main(void); /* witness.c */
int killuid_main(void); /* bombs.c */

/* Declare `const char *key` from the parameter of that name, or fail the attempt. */
#define NEED(r, key)                                                                            \
    const char *key = param(#key);                                                             \
    if (!key) {                                                                                \
        set_result(r, ERROR, 0, "parameter " #key " missing");                                 \
        return;                                                                                \
    }

/* Join a directory parameter and a name into buf; returns buf. */
const char *path_in(char *buf, unsigned long n, const char *dir_param, const char *name);

#endif
