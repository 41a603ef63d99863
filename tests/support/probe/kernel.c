/*
 * Namespaces, mounts and the rest of the kernel's attack surface. Where the kernel would let
 * any process make the call (add_key, perf_event_open on itself, userfaultfd in user mode,
 * modify_ldt read, personality), EPERM can only have come from the seccomp filter.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/io.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x80
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#define KEY_SPEC_SESSION_KEYRING -3
#define KEY_SPEC_PROCESS_KEYRING -2
#define HIGH_BIT (1UL << 32)

static void unshare_user(struct result *r)
{
    expect_fail(r, unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)");
}

static void unshare_net(struct result *r)
{
    expect_fail(r, unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)");
}

static void unshare_mount(struct result *r)
{
    expect_fail(r, unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)");
}

static void unshare_time(struct result *r)
{
    expect_fail(r, unshare(CLONE_NEWTIME), "unshare(CLONE_NEWTIME)");
}

/* The raw clone syscall (x86_64 order: flags, stack, parent_tid, child_tid, tls). A child that
 * was created exits at once; the parent records the success. */
static void raw_clone(struct result *r, unsigned long flags, const char *what)
{
    long pid = syscall(SYS_clone, flags, 0, 0, 0, 0);
    if (pid == 0)
        _exit(0);
    expect_fail(r, pid, what);
    if (pid > 0)
        waitpid((pid_t)pid, NULL, 0);
}

static void clone_newuser(struct result *r)
{
    raw_clone(r, CLONE_NEWUSER | SIGCHLD, "clone(CLONE_NEWUSER)");
}

static void clone_newuser_high_bits(struct result *r)
{
    /* The kernel uses only the low 32 bits of clone's flags; the filter must look there. */
    raw_clone(r, HIGH_BIT | CLONE_NEWUSER | SIGCHLD, "clone(1<<32 | CLONE_NEWUSER)");
}

static void clone_newpid(struct result *r)
{
    raw_clone(r, CLONE_NEWPID | SIGCHLD, "clone(CLONE_NEWPID)");
}

static void clone3_newuser(struct result *r)
{
    /* struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
     * tls. seccomp cannot read it, which is why clone3 is refused as a whole. */
    uint64_t args[8];
    memset(args, 0, sizeof args);
    args[0] = CLONE_NEWUSER;
    args[4] = SIGCHLD;
    long pid = syscall(SYS_clone3, args, sizeof args);
    if (pid == 0)
        _exit(0);
    expect_fail(r, pid, "clone3(CLONE_NEWUSER)");
    if (pid > 0)
        waitpid((pid_t)pid, NULL, 0);
}

static void mount_tmpfs(struct result *r)
{
    NEED(r, wd);
    expect_fail(r, mount("none", wd, "tmpfs", 0, NULL), "mount tmpfs on the workdir");
}

static void umount_proc(struct result *r)
{
    expect_fail(r, umount2("/proc", MNT_DETACH), "umount2(/proc)");
}

static void chroot_workdir(struct result *r)
{
    NEED(r, wd);
    expect_fail(r, chroot(wd), "chroot(wd)");
}

static void pivot_root_call(struct result *r)
{
    expect_fail(r, syscall(SYS_pivot_root, ".", "."), "pivot_root(., .)");
}

static void setns_call(struct result *r)
{
    /* Without the filter: EBADF. */
    expect_fail(r, setns(-1, 0), "setns(-1, 0)");
}

static void open_tree_clone(struct result *r)
{
    expect_fail(r, syscall(SYS_open_tree, AT_FDCWD, "/", OPEN_TREE_CLONE), "open_tree(/, CLONE)");
}

static void fsopen_tmpfs(struct result *r)
{
    expect_fail(r, syscall(SYS_fsopen, "tmpfs", 0), "fsopen(tmpfs)");
}

static void keyctl_call(struct result *r)
{
    /* KEYCTL_GET_KEYRING_ID of the session keyring, creating it: fine for anyone. */
    expect_fail(r, syscall(SYS_keyctl, 0, KEY_SPEC_SESSION_KEYRING, 1), "keyctl(GET_KEYRING_ID)");
}

static void add_key_call(struct result *r)
{
    expect_fail(r, syscall(SYS_add_key, "user", "osb-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING),
                "add_key(user)");
}

static void request_key_call(struct result *r)
{
    expect_fail(r, syscall(SYS_request_key, "user", "osb-probe", NULL, KEY_SPEC_PROCESS_KEYRING),
                "request_key(user)");
}

static void bpf_map_create(struct result *r)
{
    unsigned char attr[128];
    memset(attr, 0, sizeof attr);
    attr[0] = 2;  /* map_type BPF_MAP_TYPE_ARRAY */
    attr[4] = 4;  /* key_size */
    attr[8] = 4;  /* value_size */
    attr[12] = 1; /* max_entries */
    expect_fail(r, syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof attr), "bpf(MAP_CREATE)");
}

static void perf_event_open_self(struct result *r)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    expect_fail(r, syscall(SYS_perf_event_open, &a, 0, -1, -1, 0), "perf_event_open(self)");
}

static void userfaultfd_call(struct result *r)
{
    expect_fail(r, syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY),
                "userfaultfd(USER_MODE_ONLY)");
}

/* stdin is /dev/null here: without the filter these are ENOTTY. */
static void tiocsti(struct result *r)
{
    char c = 'x';
    expect_fail(r, syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI, &c), "ioctl(0, TIOCSTI)");
}

static void tiocsti_high_bits(struct result *r)
{
    char c = 'x';
    expect_fail(r, syscall(SYS_ioctl, 0, HIGH_BIT | TIOCSTI, &c), "ioctl(0, 1<<32 | TIOCSTI)");
}

static void tioclinux(struct result *r)
{
    char sub = 2; /* TIOCL_SETSEL */
    expect_fail(r, syscall(SYS_ioctl, 0, (unsigned long)TIOCLINUX, &sub), "ioctl(0, TIOCLINUX)");
}

static void control_personality_query(struct result *r)
{
    expect_fail(r, personality(0xffffffff), "personality(query)");
}

static void personality_read_implies_exec(struct result *r)
{
    expect_fail(r, personality(PER_LINUX | READ_IMPLIES_EXEC), "personality(READ_IMPLIES_EXEC)");
}

static void personality_no_randomize(struct result *r)
{
    expect_fail(r, personality(PER_LINUX | ADDR_NO_RANDOMIZE), "personality(ADDR_NO_RANDOMIZE)");
}

static void personality_high_bits(struct result *r)
{
    expect_fail(r, syscall(SYS_personality, HIGH_BIT | ADDR_NO_RANDOMIZE),
                "personality(1<<32 | ADDR_NO_RANDOMIZE)");
}

static void modify_ldt_read(struct result *r)
{
    char buf[16];
    expect_fail(r, syscall(SYS_modify_ldt, 0, buf, sizeof buf), "modify_ldt(read)");
}

static void iopl_call(struct result *r)
{
    expect_fail(r, syscall(SYS_iopl, 3), "iopl(3)");
}

static void ioperm_call(struct result *r)
{
    expect_fail(r, syscall(SYS_ioperm, 0x80, 1, 1), "ioperm(0x80)");
}

static void kexec_load_call(struct result *r)
{
    expect_fail(r, syscall(SYS_kexec_load, 0, 0, NULL, 0), "kexec_load");
}

static void finit_module_call(struct result *r)
{
    expect_fail(r, syscall(SYS_finit_module, -1, "", 0), "finit_module(-1)");
}

static void delete_module_call(struct result *r)
{
    expect_fail(r, syscall(SYS_delete_module, "osb_nonexistent", 0), "delete_module");
}

const struct attempt KERNEL_ATTEMPTS[] = {
    ATTEMPT("namespaces", unshare_user),
    ATTEMPT("namespaces", unshare_net),
    ATTEMPT("namespaces", unshare_mount),
    ATTEMPT("namespaces", unshare_time),
    ATTEMPT("namespaces", clone_newuser),
    ATTEMPT("namespaces", clone_newuser_high_bits),
    ATTEMPT("namespaces", clone_newpid),
    ATTEMPT("namespaces", clone3_newuser),
    ATTEMPT("namespaces", mount_tmpfs),
    ATTEMPT("namespaces", umount_proc),
    ATTEMPT("namespaces", chroot_workdir),
    {"namespaces", "pivot_root", pivot_root_call},
    {"namespaces", "setns", setns_call},
    ATTEMPT("namespaces", open_tree_clone),
    ATTEMPT("namespaces", fsopen_tmpfs),
    {"kernel", "keyctl", keyctl_call},
    {"kernel", "add_key", add_key_call},
    {"kernel", "request_key", request_key_call},
    ATTEMPT("kernel", bpf_map_create),
    ATTEMPT("kernel", perf_event_open_self),
    {"kernel", "userfaultfd", userfaultfd_call},
    ATTEMPT("kernel", tiocsti),
    ATTEMPT("kernel", tiocsti_high_bits),
    ATTEMPT("kernel", tioclinux),
    ATTEMPT("kernel", control_personality_query),
    ATTEMPT("kernel", personality_read_implies_exec),
    ATTEMPT("kernel", personality_no_randomize),
    ATTEMPT("kernel", personality_high_bits),
    ATTEMPT("kernel", modify_ldt_read),
    {"kernel", "iopl", iopl_call},
    {"kernel", "ioperm", ioperm_call},
    {"kernel", "kexec_load", kexec_load_call},
    {"kernel", "finit_module", finit_module_call},
    {"kernel", "delete_module", delete_module_call},
    {0},
};
