/*
 * The witness: a process outside the sandbox, started by the test as the sandbox's own uid and
 * left dumpable, so that only the sandbox (not ownership) keeps the probe away from it. It
 * prints "ready PID", counts every signal it receives until its stdin reaches EOF, then prints
 * one JSON object: {"signals":{"NUMBER":COUNT,...}}.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "probe.h"

static volatile sig_atomic_t counts[65];

static void on_signal(int sig)
{
    if (sig > 0 && sig < 65)
        counts[sig]++;
}

int witness_main(void)
{
    static const int sigs[] = {SIGUSR1, SIGUSR2, SIGIO, SIGURG, SIGTERM, SIGHUP, SIGINT, SIGQUIT};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char buf[64];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR))
            break;
    }
    printf("{\"signals\":{");
    const char *sep = "";
    for (int s = 1; s < 65; s++) {
        if (counts[s]) {
            printf("%s\"%d\":%d", sep, s, (int)counts[s]);
            sep = ",";
        }
    }
    printf("}}\n");
    return 0;
}
