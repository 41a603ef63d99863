/*
 * Resource bombs and processes that try to outlive the run. Each runs alone (`probe NAME`),
 * under the limits the test chooses. Parameters:
 *   wd       the workdir
 *   marker   a process name (comm) unique to the test, so the test can find survivors
 *   limit    the limit the test set (bytes or processes), echoed in the detail
 *   procs, each_mib   for membomb_multi
 * The test judges what happens after the probe is gone: nothing with the marker may be left.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

#define MIB (1024L * 1024L)

static int count_named(const char *name)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[300], comm[32] = "";
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(p, sizeof p, "/proc/%s/comm", e->d_name);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t k = read(fd, comm, sizeof comm - 1);
        close(fd);
        comm[k > 0 ? k : 0] = 0;
        comm[strcspn(comm, "\n")] = 0;
        n += strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

/* A real fork bomb: every process forks forever, and keeps trying after EAGAIN. */
static void forkbomb(struct result *r)
{
    NEED(r, marker);
    prctl(PR_SET_NAME, marker, 0, 0, 0);
    long made = 0;
    int err = 0;
    for (;;) {
        pid_t p = fork();
        if (p == 0)
            for (;;)
                fork();
        if (p < 0) {
            err = errno;
            break;
        }
        made++;
    }
    int alive = count_named(marker);
    set_result(r, err == EAGAIN ? CONTAINED : ERROR, err,
               "fork failed after made=%ld direct children; alive=%d bomb processes; limit=%ld",
               made, alive, param_long("limit", -1));
}

static long touch_until_failure(long chunk, long cap, int *err)
{
    long total = 0;
    while (total < cap) {
        char *p = mmap(NULL, (size_t)chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED) {
            *err = errno;
            break;
        }
        memset(p, 0x5a, (size_t)chunk);
        total += chunk;
    }
    return total;
}

static void membomb(struct result *r)
{
    int err = 0;
    /* Stop at 4 GiB even if nothing stops us: the finding is made long before. */
    long total = touch_until_failure(4 * MIB, 4096 * MIB, &err);
    set_result(r, err == ENOMEM ? CONTAINED : ALLOWED, err,
               "touched_mib=%ld before failing; limit=%ld", total / MIB, param_long("limit", -1));
}

/*
 * Several processes, each under the per-process RLIMIT_AS, together above it. Only a memory
 * cgroup bounds the sum. Each child touches its share and reports on its own pipe; once every
 * child has reported or died, the parent asks each one in turn to touch its memory again and
 * answer. A child OOM-killed in the meantime never answers, so every answer is from a process
 * that held its share while all the others had finished allocating: they hold it at once.
 */
static void membomb_multi(struct result *r)
{
    long procs = param_long("procs", 4), each = param_long("each_mib", 64) * MIB;
    if (procs > 16)
        procs = 16;
    /* Asking a child that was OOM-killed is EPIPE, not death. */
    signal(SIGPIPE, SIG_IGN);
    pid_t kids[16];
    int ask[16][2], answer[16][2];
    for (long i = 0; i < procs; i++) {
        if (pipe2(ask[i], O_CLOEXEC) != 0 || pipe2(answer[i], O_CLOEXEC) != 0) {
            set_result(r, ERROR, errno, "pipe2");
            return;
        }
    }
    for (long i = 0; i < procs; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            for (long j = 0; j < procs; j++) {
                close(ask[j][1]);
                close(answer[j][0]);
                if (j != i) {
                    close(ask[j][0]);
                    close(answer[j][1]);
                }
            }
            char *mem = mmap(NULL, (size_t)each, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (mem == MAP_FAILED)
                _exit(1);
            memset(mem, 0x5a, (size_t)each);
            char c = 'r';
            if (write(answer[i][1], &c, 1) != 1 || read(ask[i][0], &c, 1) != 1)
                _exit(1);
            volatile long sum = 0;
            for (long k = 0; k < each; k += 4096)
                sum += mem[k];
            if (write(answer[i][1], &c, 1) != 1)
                _exit(1);
            for (;;)
                pause();
        }
    }
    for (long i = 0; i < procs; i++) {
        close(ask[i][0]);
        close(answer[i][1]);
    }
    /* First round: every child reports or dies (EOF). */
    int reported[16] = {0};
    for (long i = 0; i < procs; i++) {
        char c;
        reported[i] = read(answer[i][0], &c, 1) == 1;
    }
    /* Second round: only the living answer. */
    long held = 0;
    for (long i = 0; i < procs; i++) {
        char c = 'a';
        if (reported[i] && write(ask[i][1], &c, 1) == 1 && read(answer[i][0], &c, 1) == 1)
            held++;
    }
    for (long i = 0; i < procs; i++) {
        if (kids[i] <= 0)
            continue;
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    long limit = param_long("limit", -1);
    set_result(r, held * each <= limit ? CONTAINED : ALLOWED, 0,
               "held=%ld of procs=%ld processes held each_mib=%ld at once: total_mib=%ld; "
               "limit_mib=%ld",
               held, procs, each / MIB, held * each / MIB, limit / MIB);
}

static long fill_file(const char *path, int *err)
{
    static char chunk[64 * 1024];
    memset(chunk, 'f', sizeof chunk);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    long total = 0;
    for (;;) {
        ssize_t w = write(fd, chunk, sizeof chunk);
        if (w <= 0) {
            *err = w < 0 ? errno : 0;
            break;
        }
        total += w;
        if (total > 64 * 1024 * 1024L)
            break; /* nothing stopped us: enough to prove it */
    }
    close(fd);
    return total;
}

/* SIGXFSZ left as the supervisor set it (ignored under --file-size): the write past the
 * limit fails with EFBIG. */
static void diskfill(struct result *r)
{
    char path[512];
    int err = 0;
    long total = fill_file(path_in(path, sizeof path, "wd", "fill.bin"), &err);
    set_result(r, err == EFBIG ? CONTAINED : ALLOWED, err, "wrote bytes=%ld; limit=%ld", total,
               param_long("limit", -1));
}

/* RLIMIT_FSIZE is per file: many files each stop at the limit, and the sum does not. An
 * adversary ignores SIGXFSZ, so that each write past the limit fails with EFBIG instead. */
static void diskfill_many(struct result *r)
{
    signal(SIGXFSZ, SIG_IGN);
    long files = param_long("files", 4), total = 0, biggest = 0;
    int all_efbig = 1;
    for (long i = 0; i < files; i++) {
        char name[32], path[512];
        int err = 0;
        snprintf(name, sizeof name, "fill-%ld.bin", i);
        long n = fill_file(path_in(path, sizeof path, "wd", name), &err);
        all_efbig &= err == EFBIG;
        total += n > 0 ? n : 0;
        biggest = n > biggest ? n : biggest;
    }
    set_result(r, all_efbig ? CONTAINED : ALLOWED, all_efbig ? EFBIG : 0,
               "files=%ld, largest=%ld bytes, total=%ld bytes; per-file limit=%ld", files,
               biggest, total, param_long("limit", -1));
}

/*
 * Double fork and setsid: the classic daemon. The grandchild ignores the polite signals and
 * waits forever (`daemon`), or keeps forking and exiting so that its pid never stays the same
 * (`flee`). The first byte on the pipe says it runs.
 */
static void spawn_daemon(struct result *r, int flee)
{
    NEED(r, marker);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        set_result(r, ERROR, errno, "pipe2");
        return;
    }
    pid_t c = fork();
    if (c == 0) {
        if (fork() != 0)
            _exit(0);
        setsid();
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        prctl(PR_SET_NAME, marker, 0, 0, 0);
        char msg[32];
        int len = snprintf(msg, sizeof msg, "%d", getpid());
        ssize_t w = write(p[1], msg, (size_t)len);
        (void)w;
        close(p[1]);
        close(p[0]);
        if (!flee)
            for (;;)
                pause();
        for (;;)
            if (fork() > 0)
                _exit(0);
    }
    close(p[1]);
    waitpid(c, NULL, 0);
    char buf[32] = "";
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    if (n <= 0) {
        set_result(r, ERROR, errno, "the daemon never reported");
        return;
    }
    set_result(r, PENDING, 0, "daemon pid=%s in a session of its own; the test checks it is gone",
               buf);
}

/*
 * A daemon that is a chain: setsid, then each process forks the next and waits, `depth` deep.
 * Only the top is a child of the supervisor (its subreaper); every other link has a live
 * parent, is in no session of the exec, and its parents never lead back to the exec's leader.
 * The chain lets go of the output pipes, so that the run can end while it lives.
 */
static void daemon_deep(struct result *r)
{
    NEED(r, marker);
    long depth = param_long("depth", 300);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        set_result(r, ERROR, errno, "pipe2");
        return;
    }
    pid_t c = fork();
    if (c == 0) {
        if (fork() != 0)
            _exit(0);
        setsid();
        prctl(PR_SET_NAME, marker, 0, 0, 0);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        for (int fd = 0; fd < 3; fd++)
            dup2(null, fd);
        close(p[0]);
        for (long level = 1; level < depth; level++) {
            pid_t next = fork();
            if (next < 0)
                break;
            if (next > 0) {
                close(p[1]);
                for (;;)
                    pause();
            }
        }
        /* The last link says the whole chain stands. */
        char msg[32];
        int len = snprintf(msg, sizeof msg, "%d", getpid());
        ssize_t w = write(p[1], msg, (size_t)len);
        (void)w;
        close(p[1]);
        for (;;)
            pause();
    }
    close(p[1]);
    waitpid(c, NULL, 0);
    char buf[32] = "";
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    if (n <= 0) {
        set_result(r, ERROR, errno, "the chain never reported");
        return;
    }
    set_result(r, PENDING, 0, "chain of depth=%ld stands, deepest pid=%s; the test checks it is gone",
               depth, buf);
}

static void daemon_setsid(struct result *r)
{
    spawn_daemon(r, 0);
}

static void daemon_flee(struct result *r)
{
    spawn_daemon(r, 1);
}

/* Not an attempt: the test's cleanup, run outside the sandbox as one test uid. kill(-1)
 * reaches every process of our uid at once, which no pid-by-pid sweep can promise against a
 * process that keeps forking. Exits 0 once no live process of the uid is left but us. */
int killuid_main(void)
{
    uid_t me = getuid();
    for (int round = 0; round < 1000; round++) {
        kill(-1, SIGKILL);
        DIR *d = opendir("/proc");
        if (!d)
            return 2;
        int left = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char p[300], line[128];
            if (e->d_name[0] < '0' || e->d_name[0] > '9' || atoi(e->d_name) == getpid())
                continue;
            snprintf(p, sizeof p, "/proc/%s/status", e->d_name);
            FILE *f = fopen(p, "re");
            if (!f)
                continue;
            int zombie = 0, mine = 0;
            while (fgets(line, sizeof line, f)) {
                unsigned uid;
                if (strncmp(line, "State:", 6) == 0)
                    zombie = strchr(line, 'Z') != NULL;
                if (sscanf(line, "Uid: %u", &uid) == 1)
                    mine = uid == me;
            }
            fclose(f);
            left += mine && !zombie;
        }
        closedir(d);
        if (!left)
            return 0;
    }
    return 1;
}

const struct attempt BOMBS[] = {
    ATTEMPT("exhaustion", forkbomb),
    ATTEMPT("exhaustion", membomb),
    ATTEMPT("exhaustion", membomb_multi),
    ATTEMPT("exhaustion", diskfill),
    ATTEMPT("exhaustion", diskfill_many),
    ATTEMPT("exhaustion", daemon_setsid),
    ATTEMPT("exhaustion", daemon_flee),
    ATTEMPT("exhaustion", daemon_deep),
    {0},
};
