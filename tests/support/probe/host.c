/*
 * Attempts to leave something on the host that outlives the run: a set-uid or set-gid file in
 * the workdir, a changed mode of a procfs entry (procfs keeps it in the kernel-wide entry),
 * changed modes or times of the host's device nodes, and the kernel log. Run only by name:
 * each changes machine-wide state when it gets through, so only the test that restores that
 * state runs them (tests/escapes_host.rs). Parameters:
 *   wd          the workdir (read-write)
 *   setuid      a root-owned mode-4755 file in a --ro directory
 *   proc_entry  a root-owned procfs file with a kernel-wide mode (/proc/kpageflags)
 * The files each attempt makes in the workdir are named after it, so the test can look at
 * them from the host after the run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/klog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "probe.h"

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

/* wd/NAME, and a fresh empty file there (mode 0755) for the attempts that change one. */
static const char *wd_file(char *buf, unsigned long n, const char *name, int create)
{
    path_in(buf, n, "wd", name);
    if (create) {
        unlink(buf);
        int fd = open(buf, O_CREAT | O_WRONLY | O_CLOEXEC, 0755);
        if (fd >= 0)
            close(fd);
    }
    return buf;
}

/* A call that must fail, and a descriptor to close when it did not. */
static void expect_fail_fd(struct result *r, long rc, const char *what)
{
    expect_fail(r, rc, what);
    if (rc >= 0)
        close((int)rc);
}

/* ---- set-id bits on the workdir's files ------------------------------------------------ */

static void chmod_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "chmod-setuid", 1);
    expect_fail(r, syscall(SYS_chmod, p, 04755), "chmod(04755)");
}

static void chmod_setgid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "chmod-setgid", 1);
    expect_fail(r, syscall(SYS_chmod, p, 02755), "chmod(02755)");
}

/* High bits of the mode word: the kernel reads a umode_t, so they change nothing. */
static void chmod_setuid_high_bits(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "chmod-setuid-high", 1);
    expect_fail(r, syscall(SYS_chmod, p, (1UL << 32) | 04755), "chmod((1<<32)|04755)");
}

static void fchmod_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "fchmod-setuid", 1);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_result(r, ERROR, errno, "open %s", p);
        return;
    }
    expect_fail(r, syscall(SYS_fchmod, fd, 04755), "fchmod(04755)");
    close(fd);
}

static void fchmodat_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "fchmodat-setuid", 1);
    expect_fail(r, syscall(SYS_fchmodat, AT_FDCWD, p, 04755), "fchmodat(04755)");
}

static void fchmodat2_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "fchmodat2-setuid", 1);
    expect_fail(r, syscall(SYS_fchmodat2, AT_FDCWD, p, 04755, 0), "fchmodat2(04755)");
}

static void open_creat_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "open-creat-setuid", 0);
    expect_fail_fd(r, syscall(SYS_open, p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 04755),
                   "open(O_CREAT, 04755)");
}

static void openat_creat_setgid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "openat-creat-setgid", 0);
    expect_fail_fd(r,
                   syscall(SYS_openat, AT_FDCWD, p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
                           02755),
                   "openat(O_CREAT, 02755)");
}

static void creat_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "creat-setuid", 0);
    expect_fail_fd(r, syscall(SYS_creat, p, 04755), "creat(04755)");
}

/* An unnamed file with the bits, then given a name in the workdir. */
static void open_tmpfile_setuid(struct result *r)
{
    const char *wd = param("wd");
    if (!wd) {
        set_result(r, ERROR, 0, "parameter wd missing");
        return;
    }
    long fd = syscall(SYS_openat, AT_FDCWD, wd, O_TMPFILE | O_WRONLY | O_CLOEXEC, 04755);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "openat(O_TMPFILE, 04755)");
        return;
    }
    char src[64], p[512];
    snprintf(src, sizeof src, "/proc/self/fd/%ld", fd);
    wd_file(p, sizeof p, "tmpfile-setuid", 0);
    int linked = linkat(AT_FDCWD, src, AT_FDCWD, p, AT_SYMLINK_FOLLOW);
    set_result(r, ALLOWED, 0, "openat(O_TMPFILE, 04755) returned %ld; link: %d", fd, linked);
    close((int)fd);
}

/* openat2 carries its mode in a struct seccomp cannot read. */
static void openat2_creat_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "openat2-setuid", 0);
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC;
    how.mode = 04755;
    expect_fail_fd(r, syscall(SYS_openat2, AT_FDCWD, p, &how, sizeof how),
                   "openat2(O_CREAT, 04755)");
}

/* A set-gid directory hands its group to everything made in it. */
static void mkdir_setgid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "mkdir-setgid", 0);
    expect_fail(r, syscall(SYS_mkdir, p, 02755), "mkdir(02755)");
}

static void mkdirat_setgid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "mkdirat-setgid", 0);
    expect_fail(r, syscall(SYS_mkdirat, AT_FDCWD, p, 02755), "mkdirat(02755)");
}

static void mknod_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "mknod-setuid", 0);
    expect_fail(r, syscall(SYS_mknod, p, S_IFREG | 04755, 0), "mknod(S_IFREG|04755)");
}

static void mknodat_setuid(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "mknodat-setuid", 0);
    expect_fail(r, syscall(SYS_mknodat, AT_FDCWD, p, S_IFREG | 04755, 0),
                "mknodat(S_IFREG|04755)");
}

/* What `cp -p` and tar do with a set-uid file: copy the bytes, then set the mode. */
static void copy_setuid_preserving_mode(struct result *r)
{
    NEED(r, setuid);
    struct stat st;
    if (stat(setuid, &st) != 0 || !(st.st_mode & S_ISUID)) {
        set_result(r, ERROR, errno, "%s is not set-uid", setuid);
        return;
    }
    int in = open(setuid, O_RDONLY | O_CLOEXEC);
    char p[512];
    wd_file(p, sizeof p, "copied-setuid", 0);
    int out = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0700);
    if (in < 0 || out < 0) {
        set_result(r, ERROR, errno, "open for the copy");
        return;
    }
    char buf[4096];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            break;
    expect_fail(r, syscall(SYS_fchmod, out, st.st_mode & 07777), "fchmod(copy, 04755)");
    close(in);
    close(out);
}

/* An existing set-uid binary of another grant moved or linked into the workdir. */
static void rename_setuid_into_workdir(struct result *r)
{
    NEED(r, setuid);
    char p[512];
    wd_file(p, sizeof p, "renamed-setuid", 0);
    expect_fail(r, rename(setuid, p), "rename(setuid helper, workdir)");
}

static void link_setuid_into_workdir(struct result *r)
{
    NEED(r, setuid);
    char p[512];
    wd_file(p, sizeof p, "linked-setuid", 0);
    expect_fail(r, link(setuid, p), "link(setuid helper, workdir)");
}

/* Controls: modes without the set-id bits stay the program's own business. */
static void control_chmod_plain(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "control-chmod", 1);
    expect_fail(r, syscall(SYS_chmod, p, 01750), "chmod(01750)");
}

static void control_open_creat_plain(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "control-creat", 0);
    long fd = syscall(SYS_openat, AT_FDCWD, p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0750);
    expect_fail_fd(r, fd, "openat(O_CREAT, 0750)");
}

/* Without O_CREAT the kernel ignores the mode: whatever is in it must not matter. */
static void control_open_existing_with_setuid_mode(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "control-open-mode", 1);
    expect_fail_fd(r, syscall(SYS_open, p, O_RDONLY | O_CLOEXEC, 04755),
                   "open(O_RDONLY, mode 04755)");
}

static void control_mkdir_plain(struct result *r)
{
    char p[512];
    wd_file(p, sizeof p, "control-mkdir", 0);
    expect_fail(r, syscall(SYS_mkdir, p, 01755), "mkdir(01755)");
}

/* ---- procfs and the device nodes ------------------------------------------------------- */

/* Toggle one permission bit of `path` (by name, or of `fd` when >= 0). */
static void toggle_mode(struct result *r, const char *path, int fd, mode_t bit)
{
    struct stat st;
    if ((fd >= 0 ? fstat(fd, &st) : stat(path, &st)) != 0) {
        set_result(r, BLOCKED, errno, "stat %s", path);
        return;
    }
    mode_t want = (st.st_mode & 07777) ^ bit;
    long rc = fd >= 0 ? syscall(SYS_fchmod, fd, want) : syscall(SYS_chmod, path, want);
    char what[300];
    snprintf(what, sizeof what, "chmod %s %o -> %o", path, st.st_mode & 07777, want);
    expect_fail(r, rc, what);
}

static const struct timespec EPOCH_TIMES[2] = {{1000000000, 0}, {1000000000, 0}};

static void chmod_proc_entry(struct result *r)
{
    NEED(r, proc_entry);
    toggle_mode(r, proc_entry, -1, 0040);
}

static void chmod_dev_null(struct result *r)
{
    toggle_mode(r, "/dev/null", -1, 0001);
}

static void utimes_dev_full(struct result *r)
{
    expect_fail(r, utimensat(AT_FDCWD, "/dev/full", EPOCH_TIMES, 0), "utimensat(/dev/full)");
}

/* The supervisor hands a stdin of /dev/null over as a descriptor it opened itself. */
static int stdin_is_device(struct result *r)
{
    struct stat st;
    if (fstat(0, &st) != 0 || !S_ISCHR(st.st_mode)) {
        set_result(r, ERROR, 0, "stdin is not a device (run the probe with stdin /dev/null)");
        return 0;
    }
    return 1;
}

static void fchmod_stdin_dev_null(struct result *r)
{
    if (stdin_is_device(r))
        toggle_mode(r, "stdin", 0, 0001);
}

static void futimens_stdin_dev_null(struct result *r)
{
    if (stdin_is_device(r))
        expect_fail(r, futimens(0, EPOCH_TIMES), "futimens(stdin)");
}

/* Writing to a device works on a read-only mount: the shell's `> /dev/null` must. */
static void control_write_dev_null(struct result *r)
{
    int fd = open("/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "open /dev/null for writing");
        return;
    }
    ssize_t n = write(fd, "x", 1);
    set_result(r, n == 1 ? ALLOWED : BLOCKED, n == 1 ? 0 : errno, "write /dev/null: %zd", n);
    close(fd);
}

/* ---- kernel channels ------------------------------------------------------------------- */

static void syslog_read_all(struct result *r)
{
    static char buf[1 << 16];
    expect_fail(r, klogctl(3 /* SYSLOG_ACTION_READ_ALL */, buf, sizeof buf), "syslog(READ_ALL)");
}

static void syslog_size_buffer(struct result *r)
{
    expect_fail(r, klogctl(10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0), "syslog(SIZE_BUFFER)");
}

/* The core limit must be the kernel's "no dump to a helper" value, and locked. */
static void raise_rlimit_core(struct result *r)
{
    struct rlimit l;
    getrlimit(RLIMIT_CORE, &l);
    struct rlimit up = {l.rlim_max + 1, l.rlim_max + 1};
    int rc = setrlimit(RLIMIT_CORE, &up);
    int e = errno;
    set_result(r, rc == 0 ? ALLOWED : BLOCKED, rc == 0 ? 0 : e,
               "setrlimit(CORE, hard+1) soft=%llu hard=%llu", (unsigned long long)l.rlim_cur,
               (unsigned long long)l.rlim_max);
}

const struct attempt HOST_BY_NAME[] = {
    ATTEMPT("setid", chmod_setuid),
    ATTEMPT("setid", chmod_setgid),
    ATTEMPT("setid", chmod_setuid_high_bits),
    ATTEMPT("setid", fchmod_setuid),
    ATTEMPT("setid", fchmodat_setuid),
    ATTEMPT("setid", fchmodat2_setuid),
    ATTEMPT("setid", open_creat_setuid),
    ATTEMPT("setid", openat_creat_setgid),
    ATTEMPT("setid", creat_setuid),
    ATTEMPT("setid", open_tmpfile_setuid),
    ATTEMPT("setid", openat2_creat_setuid),
    ATTEMPT("setid", mkdir_setgid),
    ATTEMPT("setid", mkdirat_setgid),
    ATTEMPT("setid", mknod_setuid),
    ATTEMPT("setid", mknodat_setuid),
    ATTEMPT("setid", copy_setuid_preserving_mode),
    ATTEMPT("setid", rename_setuid_into_workdir),
    ATTEMPT("setid", link_setuid_into_workdir),
    ATTEMPT("setid", control_chmod_plain),
    ATTEMPT("setid", control_open_creat_plain),
    ATTEMPT("setid", control_open_existing_with_setuid_mode),
    ATTEMPT("setid", control_mkdir_plain),
    ATTEMPT("nodes", chmod_proc_entry),
    ATTEMPT("nodes", chmod_dev_null),
    ATTEMPT("nodes", utimes_dev_full),
    ATTEMPT("nodes", fchmod_stdin_dev_null),
    ATTEMPT("nodes", futimens_stdin_dev_null),
    ATTEMPT("nodes", control_write_dev_null),
    ATTEMPT("kernel", syslog_read_all),
    ATTEMPT("kernel", syslog_size_buffer),
    ATTEMPT("kernel", raise_rlimit_core),
    {0},
};
