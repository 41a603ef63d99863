/*
 * Filesystem escapes. Parameters (set by the test):
 *   wd             the workdir (read-write)
 *   ro_public      a readable file in a --ro directory, beside the denied one (control)
 *   outside        a directory outside every grant, mode 0777
 *   outside_file   a file in it, mode 0644 and owned by the sandbox uid
 *   secret         the stand-in TLS key in a --deny directory, owned by the sandbox uid
 *   secret_dir     that --deny directory; it also holds rename-me.key, as outside holds
 *                  rename-me.txt, for the rename attempts
 *   tls            a file in /etc/openshell-tls, a default secret directory, owned likewise
 *   raw_disk, sysrq, kmsg, release_agent, root_cgroup_procs
 *                  kernel files the test found on this machine (it expects ENOENT for absent ones)
 * The files outside and the secrets belong to the sandbox uid, so ownership never protects
 * them: every refusal here is Landlock's (or a capability check where noted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "probe.h"

static void open_result(struct result *r, const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC, 0644);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "open %s", path);
        return;
    }
    close(fd);
    set_result(r, ALLOWED, 0, "opened %s", path);
}

static void make_file(const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
}

/* Controls: the sandbox must not simply refuse everything. */
static void control_write_workdir(struct result *r)
{
    char p[512];
    open_result(r, path_in(p, sizeof p, "wd", "control.txt"), O_CREAT | O_WRONLY | O_TRUNC);
}

static void control_read_ro_sibling(struct result *r)
{
    NEED(r, ro_public);
    open_result(r, ro_public, O_RDONLY);
}

static void write_outside_workdir(struct result *r)
{
    char p[512];
    open_result(r, path_in(p, sizeof p, "outside", "written.txt"), O_CREAT | O_WRONLY);
}

static void write_tmp(struct result *r)
{
    char p[64];
    snprintf(p, sizeof p, "/tmp/osb-probe-%d", getpid());
    open_result(r, p, O_CREAT | O_EXCL | O_WRONLY);
    if (r->outcome == ALLOWED)
        unlink(p);
}

static void read_etc_shadow(struct result *r)
{
    open_result(r, "/etc/shadow", O_RDONLY);
}

static void read_denied_secret(struct result *r)
{
    NEED(r, secret);
    open_result(r, secret, O_RDONLY);
}

static void list_denied_dir(struct result *r)
{
    NEED(r, secret_dir);
    open_result(r, secret_dir, O_RDONLY | O_DIRECTORY);
}

static void read_default_tls_secret(struct result *r)
{
    NEED(r, tls);
    open_result(r, tls, O_RDONLY);
}

static void read_via_proc1_root(struct result *r)
{
    NEED(r, outside_file);
    char p[512];
    snprintf(p, sizeof p, "/proc/1/root%s", outside_file);
    open_result(r, p, O_RDONLY);
}

static void read_secret_via_proc_self_root(struct result *r)
{
    NEED(r, secret);
    char p[512];
    snprintf(p, sizeof p, "/proc/self/root%s", secret);
    open_result(r, p, O_RDONLY);
}

/* Link attempts: creating the link inside the workdir is allowed; following it is not. */
static void follow_new_symlink(struct result *r, const char *target, const char *name, int flags)
{
    char link[512];
    path_in(link, sizeof link, "wd", name);
    if (symlink(target, link) != 0) {
        set_result(r, ERROR, errno, "could not create the symlink %s", link);
        return;
    }
    open_result(r, link, flags);
}

static void symlink_read_escape(struct result *r)
{
    NEED(r, outside_file);
    follow_new_symlink(r, outside_file, "link-out", O_RDONLY);
}

static void symlink_secret_escape(struct result *r)
{
    NEED(r, secret);
    follow_new_symlink(r, secret, "link-secret", O_RDONLY);
}

static void symlink_write_escape(struct result *r)
{
    char target[512];
    path_in(target, sizeof target, "outside", "via-link.txt");
    follow_new_symlink(r, target, "link-write", O_CREAT | O_WRONLY);
}

static void hardlink_outside_in(struct result *r)
{
    NEED(r, outside_file);
    char p[512];
    expect_fail(r, link(outside_file, path_in(p, sizeof p, "wd", "hl-out")), "link outside->wd");
}

static void hardlink_secret_in(struct result *r)
{
    NEED(r, secret);
    char p[512];
    expect_fail(r, link(secret, path_in(p, sizeof p, "wd", "hl-secret")), "link secret->wd");
}

static void hardlink_workdir_out(struct result *r)
{
    char src[512], dst[512];
    make_file(path_in(src, sizeof src, "wd", "to-link-out"));
    expect_fail(r, link(src, path_in(dst, sizeof dst, "outside", "hl-in")), "link wd->outside");
}

static void rename_out_of_workdir(struct result *r)
{
    char src[512], dst[512];
    make_file(path_in(src, sizeof src, "wd", "to-rename-out"));
    expect_fail(r, rename(src, path_in(dst, sizeof dst, "outside", "renamed")),
                "rename wd->outside");
}

/* The renames move files of their own, so that a rename that works (without the sandbox)
 * does not take a file from the attempts after it. */
static void rename_into_workdir(struct result *r)
{
    char src[512], dst[512];
    path_in(src, sizeof src, "outside", "rename-me.txt");
    expect_fail(r, rename(src, path_in(dst, sizeof dst, "wd", "renamed-in")),
                "rename outside->wd");
}

static void rename_secret_into_workdir(struct result *r)
{
    char src[512], dst[512];
    path_in(src, sizeof src, "secret_dir", "rename-me.key");
    expect_fail(r, rename(src, path_in(dst, sizeof dst, "wd", "stolen-key")),
                "rename secret->wd");
}

static void rename_denied_dir(struct result *r)
{
    NEED(r, secret_dir);
    char dst[512];
    snprintf(dst, sizeof dst, "%s.moved", secret_dir);
    expect_fail(r, rename(secret_dir, dst), "rename the denied dir");
}

static void write_proc_sys(struct result *r)
{
    open_result(r, "/proc/sys/kernel/hostname", O_WRONLY);
}

static void open_param(struct result *r, const char *key, const char *dflt, int flags)
{
    const char *p = param(key);
    open_result(r, p ? p : dflt, flags);
}

static void write_sysrq_trigger(struct result *r)
{
    open_param(r, "sysrq", "/proc/sysrq-trigger", O_WRONLY);
}

static void write_dev_kmsg(struct result *r)
{
    open_param(r, "kmsg", "/dev/kmsg", O_WRONLY);
}

static void read_raw_disk(struct result *r)
{
    open_param(r, "raw_disk", "/dev/mem", O_RDONLY);
}

/* cgroup v1's release_agent runs a program as root in the init namespaces. */
static void write_cgroup_release_agent(struct result *r)
{
    open_param(r, "release_agent", "/sys/fs/cgroup/pids/release_agent", O_WRONLY);
}

/* Moving ourselves to the root cgroup would leave the exec's pids and memory limits. */
static void escape_to_root_cgroup(struct result *r)
{
    open_param(r, "root_cgroup_procs", "/sys/fs/cgroup/cgroup.procs", O_WRONLY);
}

static void write_proc_self_exe(struct result *r)
{
    open_result(r, "/proc/self/exe", O_WRONLY);
}

static void mknod_char_device(struct result *r)
{
    char p[512];
    /* /dev/mem's numbers; needs CAP_MKNOD, which every set lacks. */
    expect_fail(r, mknod(path_in(p, sizeof p, "wd", "mem"), S_IFCHR | 0600, makedev(1, 1)),
                "mknod c 1 1");
}

static void open_by_handle(struct result *r)
{
    NEED(r, outside_file);
    struct {
        struct file_handle fh;
        unsigned char bytes[128];
    } h;
    int mount_id;
    h.fh.handle_bytes = sizeof h.bytes;
    if (name_to_handle_at(AT_FDCWD, outside_file, &h.fh, &mount_id, 0) != 0) {
        /* Landlock does not govern name_to_handle_at; a failure here is the probe's. */
        set_result(r, ERROR, errno, "name_to_handle_at %s", outside_file);
        return;
    }
    long fd = open_by_handle_at(AT_FDCWD, &h.fh, O_RDONLY | O_CLOEXEC);
    expect_fail(r, fd, "open_by_handle_at on a file outside");
    if (fd >= 0)
        close((int)fd);
}

/*
 * Metadata and change notification. Landlock (ABI 7 here) has no access right for either:
 * these show what a child can still learn about a denied file without reading it.
 */
static void stat_denied_secret(struct result *r)
{
    NEED(r, secret);
    struct stat st;
    if (stat(secret, &st) != 0)
        set_result(r, BLOCKED, errno, "stat %s", secret);
    else
        set_result(r, ALLOWED, 0, "stat %s: size %lld, mtime %lld", secret, (long long)st.st_size,
                   (long long)st.st_mtime);
}

static void inotify_watch_denied_dir(struct result *r)
{
    NEED(r, secret_dir);
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "inotify_init1");
        return;
    }
    expect_fail(r, inotify_add_watch(fd, secret_dir, IN_ALL_EVENTS), "inotify_add_watch");
}

static void fanotify_watch_denied_dir(struct result *r)
{
    NEED(r, secret_dir);
    /* The unprivileged flavour (Linux >= 5.13): file ids and names, never descriptors. */
    int fd = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME, O_RDONLY);
    if (fd < 0) {
        set_result(r, BLOCKED, errno, "fanotify_init");
        return;
    }
    expect_fail(r,
                fanotify_mark(fd, FAN_MARK_ADD, FAN_CREATE | FAN_MODIFY | FAN_EVENT_ON_CHILD,
                              AT_FDCWD, secret_dir),
                "fanotify_mark on the denied dir");
}

const struct attempt FS_ATTEMPTS[] = {
    ATTEMPT("fs", control_write_workdir),
    ATTEMPT("fs", control_read_ro_sibling),
    ATTEMPT("fs", write_outside_workdir),
    ATTEMPT("fs", write_tmp),
    ATTEMPT("fs", read_etc_shadow),
    ATTEMPT("fs", read_denied_secret),
    ATTEMPT("fs", list_denied_dir),
    ATTEMPT("fs", read_default_tls_secret),
    ATTEMPT("fs", read_via_proc1_root),
    ATTEMPT("fs", read_secret_via_proc_self_root),
    ATTEMPT("fs", symlink_read_escape),
    ATTEMPT("fs", symlink_secret_escape),
    ATTEMPT("fs", symlink_write_escape),
    ATTEMPT("fs", hardlink_outside_in),
    ATTEMPT("fs", hardlink_secret_in),
    ATTEMPT("fs", hardlink_workdir_out),
    ATTEMPT("fs", rename_out_of_workdir),
    ATTEMPT("fs", rename_into_workdir),
    ATTEMPT("fs", rename_secret_into_workdir),
    ATTEMPT("fs", rename_denied_dir),
    ATTEMPT("fs", write_proc_sys),
    ATTEMPT("fs", write_sysrq_trigger),
    ATTEMPT("fs", write_dev_kmsg),
    ATTEMPT("fs", read_raw_disk),
    ATTEMPT("fs", write_cgroup_release_agent),
    ATTEMPT("fs", escape_to_root_cgroup),
    ATTEMPT("fs", write_proc_self_exe),
    ATTEMPT("fs", mknod_char_device),
    ATTEMPT("fs", open_by_handle),
    ATTEMPT("fs", stat_denied_secret),
    ATTEMPT("fs", inotify_watch_denied_dir),
    ATTEMPT("fs", fanotify_watch_denied_dir),
    {0},
};
