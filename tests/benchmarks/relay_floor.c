/* The floor under the hop's CPU per token: a byte relay in C, one epoll loop, no HTTP.
 *
 * Each client connection gets its own connection to the upstream and bytes go across both ways as they come,
 * one read and one write per readiness, as the hop does per token; nothing is parsed, counted or checked. What it
 * costs per streamed token on a machine (tests/benchmarks/hop_cpu.py --relay floor) is the wake-up, the epoll, the
 * read and the write: what any proxy pays, whatever its language. The hop's figure less this one is the hop's own.
 *
 *   cc -O2 -o relay_floor relay_floor.c && ./relay_floor 127.0.0.1 0 127.0.0.1 UPSTREAM_PORT
 * prints "listening on PORT" once bound. Not part of the product: a measuring instrument for the benchmark.
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FDS 65536

static int peer[MAX_FDS]; /* the other end of each relayed fd, -1 when none */

/* A connection to the upstream, connected before it turns non-blocking (loopback: at once, or refused). */
static int upstream(const struct sockaddr_in *up) {
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)up, sizeof *up) || fcntl(fd, F_SETFL, O_NONBLOCK)) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void drop(int ep, int fd) {
    int other = peer[fd];
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    peer[fd] = -1;
    if (other >= 0 && peer[other] == fd) {
        epoll_ctl(ep, EPOLL_CTL_DEL, other, NULL);
        close(other);
        peer[other] = -1;
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s LISTEN_HOST LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    struct sockaddr_in up = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    inet_pton(AF_INET, argv[1], &at.sin_addr);
    inet_pton(AF_INET, argv[3], &up.sin_addr);
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&at, sizeof at) || listen(lfd, 1024)) {
        perror("bind/listen");
        return 1;
    }
    socklen_t len = sizeof at;
    getsockname(lfd, (struct sockaddr *)&at, &len);
    printf("listening on %s:%d\n", argv[1], ntohs(at.sin_port));
    fflush(stdout);
    memset(peer, -1, sizeof peer);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd}, events[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    static char buf[65536];
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (c < 0 || c >= MAX_FDS) {
                    if (c >= 0) close(c);
                    continue;
                }
                int u = upstream(&up);
                if (u < 0 || u >= MAX_FDS) {
                    close(c);
                    if (u >= 0) close(u);
                    continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                peer[c] = u, peer[u] = c;
                ev.events = EPOLLIN, ev.data.fd = c;
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
                ev.data.fd = u;
                epoll_ctl(ep, EPOLL_CTL_ADD, u, &ev);
                continue;
            }
            if (peer[fd] < 0) continue; /* dropped earlier in this batch */
            ssize_t got = read(fd, buf, sizeof buf);
            if (got < 0 && errno == EAGAIN) continue;
            if (got <= 0) {
                drop(ep, fd);
                continue;
            }
            /* a loopback socket with room takes it whole; a blocked one (never in the benchmark) is dropped */
            if (write(peer[fd], buf, (size_t)got) != got) drop(ep, fd);
        }
    }
}
