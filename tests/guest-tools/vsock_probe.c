/*
 * vsock-probe: what guest code can do with AF_VSOCK, for the e2e attacker suite
 * (tests/tests/attacker.rs builds it with `cc -static` and copies it into the guest).
 *
 *   vsock-probe connect CID PORT      one blocking connect (3 s timeout); prints
 *                                     "connected" (exit 0) or "failed: <errno text>" (exit 1)
 *   vsock-probe hold CID PORT N SECS  N non-blocking connects held open for SECS seconds;
 *                                     prints "held N connected C" (C = how many completed)
 */
#include <errno.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
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
    fprintf(stderr, "usage: vsock-probe connect CID PORT | hold CID PORT N SECS\n");
    return 2;
}
