/*
 * The floor of a private view, for benches/run.rs: the least that any sandbox giving a
 * command the view of issue 11 must make the kernel do, and nothing else. One clone into new
 * mount, PID, IPC, UTS and network namespaces; private propagation; a tmpfs on /tmp and on
 * /dev/shm; a fresh /proc; lo up; the hostname; then, as PID 1 of the new namespace, a fork
 * of the command and a wait for it. No Landlock, no seccomp, no cgroup, no uid switch, no
 * root of granted paths, no error reporting beyond an exit code: a lower bound, not a sandbox.
 *
 * usage: [FLOOR_UID=N] floor COMMAND [ARG...]   (as root; FLOOR_UID: the command runs as
 * uid and gid N, no supplementary groups, as the sandboxed side of benches/corpus.rs does)
 */
#define _GNU_SOURCE
#include <net/if.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sched.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq r;
    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &r) != 0) _exit(13);
    r.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &r) != 0) _exit(13);
    close(s);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | SIGCHLD;
    pid_t init = syscall(SYS_clone, flags, 0, 0, 0, 0);
    if (init < 0) return 1;
    if (init == 0) {
        if (mount(0, "/", 0, MS_REC | MS_PRIVATE, 0) != 0) _exit(10);
        /* A working directory below /tmp is bound back into the new tmpfs, as a view does. */
        char cwd[4096], src[64];
        int keep = getcwd(cwd, sizeof cwd) && strncmp(cwd, "/tmp/", 5) == 0
                   ? open(cwd, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
        if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m") != 0) _exit(11);
        if (keep >= 0) {
            for (char *p = cwd + 5; (p = strchr(p, '/')); *p++ = '/') {
                *p = 0;
                mkdir(cwd, 0755);
            }
            mkdir(cwd, 0755);
            snprintf(src, sizeof src, "/proc/self/fd/%d", keep);
            if (mount(src, cwd, 0, MS_BIND | MS_REC, 0) != 0 || chdir(cwd) != 0) _exit(17);
        }
        if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m") != 0) _exit(11);
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0) != 0) _exit(12);
        loopback_up();
        if (sethostname("sandbox", 7) != 0) _exit(14);
        pid_t cmd = fork();
        if (cmd < 0) _exit(15);
        if (cmd == 0) {
            const char *uid = getenv("FLOOR_UID");
            if (uid) {
                int u = atoi(uid);
                if (setgroups(0, 0) != 0 || setgid(u) != 0 || setuid(u) != 0) _exit(16);
            }
            execv(argv[1], argv + 1);
            _exit(127);
        }
        int st;
        while (waitpid(cmd, &st, 0) < 0) {}
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    int st;
    while (waitpid(init, &st, 0) < 0) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
