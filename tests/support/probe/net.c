/*
 * Network. Parameters:
 *   abstract        name of an abstract unix stream socket the test listens on, outside
 *   abstract_dgram  name of an abstract unix datagram socket the test bound, outside
 *   unix_path       a pathname unix stream socket the test listens on, in the outside dir
 * The test checks afterwards that no connection or datagram reached its sockets.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/netlink.h>
#include <linux/vm_sockets.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "probe.h"

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef AF_KCM
#define AF_KCM 41
#endif

static void socket_result(struct result *r, int family, int type, int proto, const char *what)
{
    int fd = socket(family, type | SOCK_CLOEXEC, proto);
    expect_fail(r, fd, what);
    if (fd >= 0)
        close(fd);
}

static void control_socket_unix(struct result *r)
{
    socket_result(r, AF_UNIX, SOCK_STREAM, 0, "socket(AF_UNIX)");
}

static void socket_inet(struct result *r)
{
    socket_result(r, AF_INET, SOCK_STREAM, 0, "socket(AF_INET, SOCK_STREAM)");
}

static void socket_inet_udp(struct result *r)
{
    socket_result(r, AF_INET, SOCK_DGRAM, 0, "socket(AF_INET, SOCK_DGRAM)");
}

static void socket_inet6(struct result *r)
{
    socket_result(r, AF_INET6, SOCK_STREAM, 0, "socket(AF_INET6)");
}

static void socket_netlink_route(struct result *r)
{
    socket_result(r, AF_NETLINK, SOCK_RAW, NETLINK_ROUTE, "socket(AF_NETLINK, ROUTE)");
}

static void socket_netlink_audit(struct result *r)
{
    socket_result(r, AF_NETLINK, SOCK_RAW, NETLINK_AUDIT, "socket(AF_NETLINK, AUDIT)");
}

static void socket_packet(struct result *r)
{
    socket_result(r, AF_PACKET, SOCK_RAW, 0, "socket(AF_PACKET)");
}

static void socket_vsock(struct result *r)
{
    socket_result(r, AF_VSOCK, SOCK_STREAM, 0, "socket(AF_VSOCK)");
}

/* Families outside `--network all`'s allow-list (AF_UNIX, AF_INET, AF_INET6, route netlink):
 * each is kernel code an ordinary build or test never needs, several with a history of
 * exploits (AF_ALG, TIPC, RDS, KCM), and socket() would autoload the module of one not yet
 * loaded. EPERM in both network modes; without the filter, EAFNOSUPPORT where the kernel lacks
 * the family, so only the filter answers EPERM. */
static void socket_alg(struct result *r)
{
    socket_result(r, AF_ALG, SOCK_SEQPACKET, 0, "socket(AF_ALG)");
}

static void socket_tipc(struct result *r)
{
    socket_result(r, AF_TIPC, SOCK_RDM, 0, "socket(AF_TIPC)");
}

static void socket_rds(struct result *r)
{
    socket_result(r, AF_RDS, SOCK_SEQPACKET, 0, "socket(AF_RDS)");
}

static void socket_xdp(struct result *r)
{
    socket_result(r, AF_XDP, SOCK_RAW, 0, "socket(AF_XDP)");
}

static void socket_kcm(struct result *r)
{
    socket_result(r, AF_KCM, SOCK_DGRAM, 0, "socket(AF_KCM)");
}

static void socket_can(struct result *r)
{
    socket_result(r, AF_CAN, SOCK_RAW, 1 /* CAN_RAW */, "socket(AF_CAN)");
}

static void socket_bluetooth(struct result *r)
{
    socket_result(r, AF_BLUETOOTH, SOCK_STREAM, 3 /* BTPROTO_RFCOMM */, "socket(AF_BLUETOOTH)");
}

/* socketpair(2) creates its sockets through the same per-family code as socket(2). */
static void socketpair_result(struct result *r, int family, int type, int proto, const char *what)
{
    int sv[2];
    int rc = socketpair(family, type | SOCK_CLOEXEC, proto, sv);
    expect_fail(r, rc, what);
    if (rc == 0) {
        close(sv[0]);
        close(sv[1]);
    }
}

static void control_socketpair_unix(struct result *r)
{
    socketpair_result(r, AF_UNIX, SOCK_STREAM, 0, "socketpair(AF_UNIX)");
}

static void socketpair_inet(struct result *r)
{
    socketpair_result(r, AF_INET, SOCK_STREAM, 0, "socketpair(AF_INET)");
}

static void socketpair_alg(struct result *r)
{
    socketpair_result(r, AF_ALG, SOCK_SEQPACKET, 0, "socketpair(AF_ALG)");
}

static void socketpair_netlink_audit(struct result *r)
{
    socketpair_result(r, AF_NETLINK, SOCK_RAW, NETLINK_AUDIT, "socketpair(AF_NETLINK, AUDIT)");
}

static socklen_t abstract_addr(struct sockaddr_un *a, const char *name)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n > sizeof a->sun_path - 1)
        n = sizeof a->sun_path - 1;
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] == 0: the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void connect_abstract_outside(struct result *r)
{
    NEED(r, abstract);
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, abstract);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_result(r, ERROR, errno, "socket(AF_UNIX)");
        return;
    }
    expect_fail(r, connect(fd, (struct sockaddr *)&a, len), "connect to @abstract");
}

static void sendto_abstract_dgram_outside(struct result *r)
{
    NEED(r, abstract_dgram);
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, abstract_dgram);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_result(r, ERROR, errno, "socket(AF_UNIX, DGRAM)");
        return;
    }
    expect_fail(r, sendto(fd, "x", 1, 0, (struct sockaddr *)&a, len), "sendto @abstract");
}

static void connect_pathname_unix_outside(struct result *r)
{
    NEED(r, unix_path);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", unix_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_result(r, ERROR, errno, "socket(AF_UNIX)");
        return;
    }
    expect_fail(r, connect(fd, (struct sockaddr *)&a, sizeof a), "connect to a pathname socket");
}

static void io_uring_setup_call(struct result *r)
{
    unsigned char params[120]; /* struct io_uring_params */
    memset(params, 0, sizeof params);
    expect_fail(r, syscall(SYS_io_uring_setup, 4, params), "io_uring_setup");
}

const struct attempt NET_ATTEMPTS[] = {
    ATTEMPT("net", control_socket_unix),
    ATTEMPT("net", socket_inet),
    ATTEMPT("net", socket_inet_udp),
    ATTEMPT("net", socket_inet6),
    ATTEMPT("net", socket_netlink_route),
    ATTEMPT("net", socket_netlink_audit),
    ATTEMPT("net", socket_packet),
    ATTEMPT("net", socket_vsock),
    ATTEMPT("net", socket_alg),
    ATTEMPT("net", socket_tipc),
    ATTEMPT("net", socket_rds),
    ATTEMPT("net", socket_xdp),
    ATTEMPT("net", socket_kcm),
    ATTEMPT("net", socket_can),
    ATTEMPT("net", socket_bluetooth),
    ATTEMPT("net", control_socketpair_unix),
    ATTEMPT("net", socketpair_inet),
    ATTEMPT("net", socketpair_alg),
    ATTEMPT("net", socketpair_netlink_audit),
    ATTEMPT("net", connect_abstract_outside),
    ATTEMPT("net", sendto_abstract_dgram_outside),
    ATTEMPT("net", connect_pathname_unix_outside),
    {"net", "io_uring_setup", io_uring_setup_call},
    {0},
};
