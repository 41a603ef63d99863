/* The egress tests' client, run inside the sandbox's network namespace. One source, copied to
 * several paths so that each copy is a different executable to the proxy's binary rules.
 *
 *   probe REQUEST [AFTER]     connect to 10.200.0.1:3128, send REQUEST (\r \n \\ escapes
 *                             decoded), print everything received; after a "200" answer, send
 *                             AFTER and print its echo too. Ends at EOF or after 3 s of quiet.
 *   probe --hold REQUEST [AFTER]  as above with AFTER (default "ping"), then wait (up to 30 s) for the proxy to
 *                             close: prints "CLOSED eof" or "CLOSED <errno>" or "TIMEOUT".
 *   probe --direct IP PORT    connect without the proxy: prints "connected" or the errno name.
 *   probe --flood N REQUEST   open N connections, send REQUEST on each, classify the answers
 *                             ("ok=.. limit=.. closed=.. silent=.."), print "READY", then hold
 *                             every connection until stdin closes.
 *   launch [--exec] PROG ARG.. run PROG as a child (fork, exec, wait), or exec it in place.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

static const char *errname(int e) {
    switch (e) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ENETUNREACH: return "ENETUNREACH";
    case ECONNRESET: return "ECONNRESET";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    default: return "EOTHER";
    }
}

static size_t unescape(const char *s, char *out) {
    size_t n = 0;
    for (; *s; s++) {
        if (*s == '\\' && s[1]) {
            s++;
            out[n++] = *s == 'r' ? '\r' : *s == 'n' ? '\n' : *s;
        } else {
            out[n++] = *s;
        }
    }
    return n;
}

static int dial(const char *ip, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

static void send_all(int fd, const char *b, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        b += w;
        n -= w;
    }
}

/* Read and print until EOF, an error, or `quiet_ms` without data. Returns 0 at EOF, the errno
 * on error, -1 on quiet. Fills `first` with the start of what was read. */
static int drain(int fd, int quiet_ms, char *first, size_t cap, size_t *got) {
    char buf[65536];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, quiet_ms);
        if (r == 0) return -1;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0) return 0;
        if (n < 0) return errno;
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
        if (first && *got < cap) {
            size_t k = (size_t)n < cap - *got ? (size_t)n : cap - *got;
            memcpy(first + *got, buf, k);
            *got += k;
        }
    }
}

/* Read until the response head is complete (a blank line), EOF, or 5 s of quiet; print it. */
static int read_head(int fd, char *head, size_t cap, size_t *got) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) == 0) return -1;
        ssize_t n = recv(fd, head + *got, cap - 1 - *got, 0);
        if (n == 0) return 0;
        if (n < 0) return errno;
        fwrite(head + *got, 1, n, stdout);
        fflush(stdout);
        *got += n;
        head[*got] = 0;
        if (strstr(head, "\r\n\r\n") || *got + 1 >= cap) return 1;
    }
}

static int request(int argc, char **argv, int hold) {
    static char req[1 << 16];
    size_t n = unescape(argv[0], req);
    int fd = dial("10.200.0.1", 3128);
    if (fd < 0) {
        printf("connect: %s\n", errname(-fd));
        return 2;
    }
    send_all(fd, req, n);
    static char head[1 << 16];
    size_t got = 0;
    int r = read_head(fd, head, sizeof head, &got);
    int tunnel = r == 1 && strncmp(head, "HTTP/1.1 200 Connection Established", 35) == 0;
    if (tunnel && (hold || argc > 1)) {
        static char after[1 << 16];
        size_t an = argc > 1 ? unescape(argv[1], after) : (memcpy(after, "ping", 4), 4);
        send_all(fd, after, an);
        if (hold) {
            /* The echo of "ping", then wait for the close. */
            int end = drain(fd, 30000, NULL, 0, NULL);
            if (end == -1) printf("\nTIMEOUT\n");
            else if (end == 0) printf("\nCLOSED eof\n");
            else printf("\nCLOSED %s\n", errname(end));
        } else {
            drain(fd, 1000, NULL, 0, NULL);
        }
    } else if (r == 1) {
        drain(fd, tunnel ? 300 : 3000, NULL, 0, NULL);
    }
    close(fd);
    return 0;
}

static int flood(int count, const char *raw) {
    static char req[1 << 16];
    size_t n = unescape(raw, req);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int *fds = calloc(count, sizeof(int));
    int opened = 0, refused = 0;
    for (int i = 0; i < count; i++) {
        fds[i] = dial("10.200.0.1", 3128);
        if (fds[i] < 0) {
            refused++;
            continue;
        }
        opened++;
        send_all(fds[i], req, n);
    }
    int ok = 0, limit = 0, closed = 0, silent = 0, other = 0;
    for (int i = 0; i < count; i++) {
        if (fds[i] < 0) continue;
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        char b[64] = {0};
        if (poll(&p, 1, i < 50 ? 10000 : 200) <= 0) {
            silent++;
            continue;
        }
        ssize_t r = recv(fds[i], b, sizeof b - 1, 0);
        if (r <= 0) closed++;
        else if (strncmp(b, "HTTP/1.1 200", 12) == 0) ok++;
        else if (strncmp(b, "HTTP/1.1 503", 12) == 0) limit++;
        else other++;
    }
    printf("opened=%d refused=%d ok=%d limit=%d closed=%d silent=%d other=%d\nREADY\n", opened,
           refused, ok, limit, closed, silent, other);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

static int launch(int argc, char **argv) {
    int in_place = argc > 1 && strcmp(argv[1], "--exec") == 0;
    char **prog = argv + 1 + in_place;
    if (in_place) {
        execv(prog[0], prog);
        return 127;
    }
    pid_t pid = fork();
    if (pid == 0) {
        execv(prog[0], prog);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv) {
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strcmp(base, "launch") == 0) return launch(argc, argv);
    if (argc >= 4 && strcmp(argv[1], "--direct") == 0) {
        int fd = dial(argv[2], atoi(argv[3]));
        if (fd < 0) printf("%s\n", errname(-fd));
        else printf("connected\n");
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "--hold") == 0) return request(argc - 2, argv + 2, 1);
    if (argc >= 4 && strcmp(argv[1], "--flood") == 0) return flood(atoi(argv[2]), argv[3]);
    if (argc >= 2) return request(argc - 1, argv + 1, 0);
    fprintf(stderr, "usage: probe REQUEST [AFTER] | --hold REQUEST | --direct IP PORT | --flood N REQUEST\n");
    return 64;
}
