/* A hostile client of the egress proxy: it makes the connection, and tries to have the
 * proxy take an allowed binary holding an inherited copy of its socket for the caller.
 *
 *   hostile zombie HOLDER HOST:PORT    the thread-group leader exits (a zombie), a thread
 *                                      keeps the socket; HOLDER (exec'd by a fork) holds a copy
 *   hostile park HOLDER HOST:PORT      the socket is parked in flight (SCM_RIGHTS on a unix
 *                                      socket) while the proxy looks, then taken back
 *   hostile flip HOLDER HOST:PORT N    N connections, each moved in and out of flight in a
 *                                      tight loop while the proxy looks
 *   hostile send HOLDER PATH           a socket not yet connected, with HOLDER holding a copy,
 *                                      handed over the unix socket at PATH, then closed here
 *   hostile receive PATH HOST:PORT     (in another network namespace) takes the socket at
 *                                      PATH, connects it to the proxy and talks
 *   hostile drop HOLDER HOST:PORT MODE  writes its whole request at once (MODE `connect`: a
 *                                      CONNECT and `hello`; `get`: a forwarded GET), then
 *                                      closes its copy before the proxy can look: only the
 *                                      holder has the socket then; prints DROPPED
 *
 *   hostile conn HOST:PORT              connects and talks, nothing else
 *   hostile reap CMD ARGS...           a subreaper that runs CMD and waits for every process
 *                                      below it (orphans included) before it exits
 *   hostile bigmaps N HOST:PORT        N processes, each with about 4 MiB of /proc/<pid>/maps
 *                                      text (1100 mappings of a file at a 3800-byte path in
 *                                      the current directory), each connects and talks; then
 *                                      2 s of sleep
 *   hostile argv DEPTH N HOST:PORT     a chain of DEPTH processes below this one, each exec'd
 *                                      with N distinct absolute paths as arguments; the last
 *                                      connects and talks
 *
 * HOLDER is run as `HOLDER 5` (sleep). Each connection sends `CONNECT HOST:PORT` and then
 * `hello`, and prints the first line of the answer, then `BODY ` and the rest on one line.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *holder, *target;
/* How long `talk` waits for each part of the answer. */
static int answer_ms = 5000;

static void die(const char *what) {
    printf("ERROR %s: %s\n", what, strerror(errno));
    fflush(stdout);
    syscall(SYS_exit_group, 3);
}

static int proxy_connect(int s) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(3128)};
    inet_pton(AF_INET, "10.200.0.1", &a.sin_addr);
    return connect(s, (struct sockaddr *)&a, sizeof a);
}

/* A fork that execs the holder with every descriptor inherited. */
static void spawn_holder(void) {
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        execl(holder, holder, "5", (char *)NULL);
        _exit(127);
    }
    usleep(200 * 1000);
}

static void send_fd(int via, int fd) {
    char b = 'x';
    struct iovec iov = {.iov_base = &b, .iov_len = 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    memset(&c, 0, sizeof c);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                       .msg_controllen = sizeof c.buf};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(via, &m, 0) != 1) die("sendmsg");
}

static int recv_fd(int via) {
    char b;
    struct iovec iov = {.iov_base = &b, .iov_len = 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                       .msg_controllen = sizeof c.buf};
    if (recvmsg(via, &m, 0) != 1) die("recvmsg");
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS) die("no descriptor");
    int fd;
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
    return fd;
}

/* Send the CONNECT and `hello`, print the answer as described above. */
static void talk(int s) {
    char head[512];
    int n = snprintf(head, sizeof head, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nhello",
                     target, target);
    if (write(s, head, n) != n) die("write");
    char buf[8192];
    size_t got = 0;
    struct pollfd p = {.fd = s, .events = POLLIN};
    while (got < sizeof buf - 1 && poll(&p, 1, answer_ms) == 1) {
        ssize_t r = read(s, buf + got, sizeof buf - 1 - got);
        if (r <= 0) break;
        got += r;
        /* A tunnel stays open: `hello` echoed back is the end of it. */
        if (got >= 5 && memcmp(buf + got - 5, "hello", 5) == 0) break;
    }
    buf[got] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    char *eol = strstr(buf, "\r\n");
    if (eol) *eol = 0;
    /* Both lines in one write: several processes of one run answer at once on the same
     * stdout, and a line of another's between a status and its BODY would give the body to
     * the wrong answer. (A pipe keeps a write of up to PIPE_BUF bytes whole.) */
    char out[sizeof buf + 64];
    int len = snprintf(out, sizeof out, "%s\n", got ? buf : "(nothing)");
    if (body) {
        body += 4;
        for (char *c = body; *c; c++) if (*c == '\n' || *c == '\r') *c = ' ';
        len += snprintf(out + len, sizeof out - len, "BODY %s\n", body);
    }
    if (len > (int)sizeof out - 1) len = (int)sizeof out - 1;
    fflush(stdout);
    if (write(1, out, len) != len) die("write stdout");
}

static void *zombie_thread(void *arg) {
    int s = (int)(long)arg;
    usleep(300 * 1000); /* the leader is a zombie by now */
    if (proxy_connect(s) != 0) die("connect");
    talk(s);
    syscall(SYS_exit_group, 0);
    return NULL;
}

static void zombie(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    spawn_holder();
    pthread_t t;
    if (pthread_create(&t, NULL, zombie_thread, (void *)(long)s) != 0) die("pthread_create");
    /* The leader alone exits: its /proc fd, exe and ns entries go empty while the thread lives. */
    syscall(SYS_exit, 0);
}

static void park(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    spawn_holder();
    int u[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, u) != 0) die("socketpair");
    if (proxy_connect(s) != 0) die("connect");
    send_fd(u[0], s);
    close(s);
    usleep(500 * 1000); /* the proxy looks now: only the holder has the socket in a table */
    talk(recv_fd(u[1]));
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void flip(int n) {
    for (int i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) die("socket");
        spawn_holder();
        int u[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, u) != 0) die("socketpair");
        if (proxy_connect(s) != 0) die("connect");
        double end = now() + 0.4;
        while (now() < end) {
            send_fd(u[0], s);
            close(s);
            s = recv_fd(u[1]);
        }
        talk(s);
        close(s);
        close(u[0]);
        close(u[1]);
    }
}

static void send_away(const char *path) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    spawn_holder();
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (connect(u, (struct sockaddr *)&a, sizeof a) != 0) die("connect unix");
    send_fd(u, s);
    close(s);
    printf("SENT\n");
}

static void receive(const char *path) {
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0) die("bind");
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    int s = recv_fd(c);
    usleep(200 * 1000); /* the sender has closed its copy: the holder and this one remain */
    if (proxy_connect(s) != 0) die("connect");
    talk(s);
}

static void drop(const char *mode) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    spawn_holder();
    if (proxy_connect(s) != 0) die("connect");
    char head[512];
    int n = strcmp(mode, "get") == 0
        ? snprintf(head, sizeof head, "GET http://%s/dropped HTTP/1.1\r\nHost: %s\r\n\r\n",
                   target, target)
        : snprintf(head, sizeof head, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nhello", target,
                   target);
    if (write(s, head, n) != n) die("write");
    close(s);
    printf("DROPPED\n");
}

static int reap(char **cmd) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) die("prctl");
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        execvp(cmd[0], cmd);
        _exit(127);
    }
    for (;;)
        if (wait(NULL) < 0 && errno == ECHILD) return 0;
}

static int argv_chain(char **argv) {
    int depth = atoi(argv[2]), n = atoi(argv[3]);
    target = argv[4];
    if (depth == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0 || proxy_connect(s) != 0) die("connect");
        talk(s);
        return 0;
    }
    char **a = calloc(n + 6, sizeof *a);
    char d[16];
    snprintf(d, sizeof d, "%d", depth - 1);
    a[0] = argv[0];
    a[1] = "argv";
    a[2] = d;
    a[3] = argv[3];
    a[4] = argv[4];
    for (int i = 0; i < n; i++) {
        a[5 + i] = malloc(24);
        snprintf(a[5 + i], 24, "/%d/%d", depth, i);
    }
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
        execv("/proc/self/exe", a);
        die("exec");
    }
    int st;
    waitpid(p, &st, 0);
    return 0;
}

static int bigmaps(int n) {
    char path[4096] = ".", name[251];
    memset(name, 'd', 250);
    name[250] = 0;
    for (int i = 0; i < 15; i++) {
        strcat(path, "/");
        strcat(path, name);
        if (mkdir(path, 0700) != 0 && errno != EEXIST) die("mkdir");
    }
    strcat(path, "/f");
    /* The proxy reads each of the N processes' 4 MiB of maps text before it answers: on a
     * loaded machine with a debug build, N of them take longer than 5 s. */
    answer_ms = 60000;
    int fd = open(path, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) die("file");
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            /* Offset 0 each time: no two mappings merge. */
            for (int j = 0; j < 1100; j++)
                if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) die("mmap");
            int s = socket(AF_INET, SOCK_STREAM, 0);
            if (s < 0 || proxy_connect(s) != 0) die("connect");
            talk(s);
            _exit(0);
        }
    }
    while (wait(NULL) > 0 || errno == EINTR) {}
    sleep(2);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "bigmaps") == 0) {
        target = argv[3];
        return bigmaps(atoi(argv[2]));
    }
    if (argc > 2 && strcmp(argv[1], "reap") == 0) return reap(argv + 2);
    if (argc >= 5 && strcmp(argv[1], "argv") == 0) return argv_chain(argv);
    if (argc == 3 && strcmp(argv[1], "conn") == 0) {
        target = argv[2];
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0 || proxy_connect(s) != 0) die("connect");
        talk(s);
        return 0;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: hostile zombie|park|flip|send|receive ...\n");
        return 2;
    }
    holder = argv[2];
    target = argv[3];
    signal(SIGCHLD, SIG_IGN);
    if (strcmp(argv[1], "send") == 0) {
        send_away(argv[3]);
        return 0;
    }
    if (strcmp(argv[1], "receive") == 0) {
        receive(argv[2]);
        return 0;
    }
    if (strcmp(argv[1], "zombie") == 0) zombie();
    else if (strcmp(argv[1], "park") == 0) park();
    else if (strcmp(argv[1], "flip") == 0) flip(argc > 4 ? atoi(argv[4]) : 5);
    else if (strcmp(argv[1], "drop") == 0) drop(argc > 4 ? argv[4] : "connect");
    else return 2;
    return 0;
}
