/* Run by the test (root), not in the sandbox: start PROGRAM in the sandbox's PID and network
 * namespaces at exactly NSPID there and HOSTPID in ours (the pid the supervisor reads), as soon
 * as they are free. It stands for a process of the sandbox that cycled the pid space (each
 * fork there takes a pid at both levels) until an allowed binary got a pid the proxy was still
 * reading: the race the proxy must not lose, made certain.
 *
 *   reuse_pid NETNS PIDNS NSPID HOSTPID PROGRAM [ARGS...]
 *
 * Prints `REUSED <pid in our namespace>` once PROGRAM runs (its exec done), with an empty
 * environment.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void die(const char *what) {
    printf("ERROR %s: %s\n", what, strerror(errno));
    exit(3);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: reuse_pid NETNS PIDNS NSPID HOSTPID PROGRAM [ARGS...]\n");
        return 2;
    }
    int net = open(argv[1], O_RDONLY | O_CLOEXEC);
    int pidns = open(argv[2], O_RDONLY | O_CLOEXEC);
    if (net < 0 || pidns < 0) die("open namespace");
    if (setns(pidns, CLONE_NEWPID) != 0) die("setns pid");
    /* Innermost namespace first. */
    pid_t want[2] = {atoi(argv[3]), atoi(argv[4])};
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) die("pipe");
    for (int i = 0; i < 10000; i++) {
        struct clone_args a;
        memset(&a, 0, sizeof a);
        a.exit_signal = SIGCHLD;
        a.set_tid = (uint64_t)(uintptr_t)want;
        a.set_tid_size = 2;
        long r = syscall(SYS_clone3, &a, sizeof a);
        if (r == 0) {
            char *env[] = {NULL};
            /* Nothing of ours stays open in it: the caller reads our output to its end. */
            int null = open("/dev/null", O_RDWR);
            if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(125);
            if (setns(net, CLONE_NEWNET) == 0) execve(argv[5], argv + 5, env);
            /* Tell the parent it did not run. */
            if (write(p[1], "x", 1) != 1) _exit(126);
            _exit(127);
        }
        if (r > 0) {
            close(p[1]);
            char b;
            /* The write end closes on exec: EOF means PROGRAM runs. */
            if (read(p[0], &b, 1) != 0) die("exec");
            printf("REUSED %ld\n", r);
            return 0;
        }
        if (errno != EEXIST) die("clone3");
        usleep(1000);
    }
    errno = ETIMEDOUT;
    die("the pid stayed taken");
    return 3;
}
