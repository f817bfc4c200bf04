/*
 * vsock-probe: what guest code can do with AF_VSOCK, for the e2e attacker suite
 * (tests/tests/attacker.rs builds it with `cc -static` and copies it into the guest).
 *
 *   vsock-probe connect CID PORT      one blocking connect (3 s timeout); prints
 *                                     "connected" (exit 0) or "failed: <errno text>" (exit 1)
 *   vsock-probe hold CID PORT N SECS  N non-blocking connects held open for SECS seconds;
 *                                     prints "held N connected C" (C = how many completed)
 *   vsock-probe sink PORT N SECS      listens on PORT, accepts up to N connections within SECS
 *                                     seconds and never reads from them; prints
 *                                     "sink accepted A" once it has N (or SECS ran out), then
 *                                     keeps them open until SECS have passed (the stall test)
 *   vsock-probe http PORT             an HTTP/1.0 server on TCP 127.0.0.1:PORT in one process
 *                                     (poll, as an event-driven model server): any request
 *                                     ending in an empty line gets "200 OK" and "ok", then the
 *                                     connection closes; a connection that sends nothing is
 *                                     kept, costing no CPU, however many there are
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int open_conn(unsigned cid, unsigned port, int nonblock) {
    int s = socket(AF_VSOCK, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (s < 0)
        return -1;
    struct timeval tv = {3, 0};
    setsockopt(s, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof tv);
    struct sockaddr_vm a;
    memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK;
    a.svm_cid = cid;
    a.svm_port = port;
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
        return s;
    if (nonblock && errno == EINPROGRESS)
        return s;
    int e = errno;
    close(s);
    errno = e;
    return -1;
}

static int connected(int s) {
    int err = 0;
    socklen_t len = sizeof err;
    struct pollfd p = {s, POLLOUT, 0};
    if (poll(&p, 1, 0) != 1)
        return 0;
    return getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
           !(p.revents & (POLLERR | POLLHUP));
}

/* Accepts up to n connections on port within secs seconds, never reading any of them. */
static int sink(unsigned port, int n, int secs) {
    int l = socket(AF_VSOCK, SOCK_STREAM, 0);
    struct sockaddr_vm a;
    memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK;
    a.svm_cid = VMADDR_CID_ANY;
    a.svm_port = port;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, n) != 0) {
        printf("failed: %s\n", strerror(errno));
        return 1;
    }
    time_t end = time(0) + secs;
    int accepted = 0;
    while (accepted < n && time(0) < end) {
        struct pollfd p = {l, POLLIN, 0};
        if (poll(&p, 1, 200) == 1 && accept(l, 0, 0) >= 0)
            accepted++;
    }
    printf("sink accepted %d\n", accepted);
    fflush(stdout);
    while (time(0) < end)
        sleep(1);
    return 0;
}

/* The `http` mode (see the top): every connection in one poll set. */
static int http(unsigned port) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1024) != 0) {
        printf("failed: %s\n", strerror(errno));
        return 1;
    }
    enum { MAX = 8192, REQ = 1024 };
    static struct pollfd p[MAX];
    static char req[MAX][REQ];
    static int got[MAX];
    int n = 1;
    p[0].fd = l;
    p[0].events = POLLIN;
    printf("http listening on %u\n", port);
    fflush(stdout);
    for (;;) {
        if (poll(p, n, -1) < 0)
            continue;
        for (int i = n - 1; i > 0; i--) {
            if (!p[i].revents)
                continue;
            int r = read(p[i].fd, req[i] + got[i], REQ - 1 - got[i]), done = 0;
            if (r > 0) {
                got[i] += r;
                req[i][got[i]] = 0;
                if (strstr(req[i], "\r\n\r\n") || strstr(req[i], "\n\n")) {
                    static const char ok[] =
                        "HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";
                    (void)!write(p[i].fd, ok, sizeof ok - 1); /* small: fits the empty buffer */
                    done = 1;
                } else if (got[i] >= REQ - 1) {
                    done = 1;
                }
            } else if (r == 0 || errno != EAGAIN) {
                done = 1;
            }
            if (done) { /* close, and move the last connection into this place */
                close(p[i].fd);
                n--;
                p[i] = p[n];
                got[i] = got[n];
                memcpy(req[i], req[n], REQ);
            }
        }
        if (p[0].revents & POLLIN) {
            int c;
            while (n < MAX && (c = accept4(l, 0, 0, SOCK_NONBLOCK)) >= 0) {
                p[n].fd = c;
                p[n].events = POLLIN;
                p[n].revents = 0;
                got[n++] = 0;
            }
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "connect") == 0) {
        int s = open_conn(strtoul(argv[2], 0, 10), strtoul(argv[3], 0, 10), 0);
        if (s < 0) {
            printf("failed: %s\n", strerror(errno));
            return 1;
        }
        printf("connected\n");
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "hold") == 0) {
        int n = atoi(argv[4]), secs = atoi(argv[5]), held = 0, ok = 0;
        int *fds = calloc(n, sizeof *fds);
        for (int i = 0; i < n; i++) {
            fds[i] = open_conn(strtoul(argv[2], 0, 10), strtoul(argv[3], 0, 10), 1);
            if (fds[i] >= 0)
                held++;
        }
        sleep(secs);
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0 && connected(fds[i]))
                ok++;
        printf("held %d connected %d\n", held, ok);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "sink") == 0)
        return sink(strtoul(argv[2], 0, 10), atoi(argv[3]), atoi(argv[4]));
    if (argc == 3 && strcmp(argv[1], "http") == 0)
        return http(strtoul(argv[2], 0, 10));
    fprintf(stderr, "usage: vsock-probe connect CID PORT | hold CID PORT N SECS | sink PORT N SECS"
                    " | http PORT\n");
    return 2;
}
