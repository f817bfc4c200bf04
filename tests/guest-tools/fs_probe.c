/* fs-probe: the static guest program the mount scenario runs in the guest to try what busybox
 * cannot (tests/src/probe.rs builds it with `cc -static`).
 *
 *   fs-probe setxattr PATH      setxattr(PATH, "user.vm", "x")
 *   fs-probe mmap-write PATH    open O_RDWR, then open O_RDONLY + mmap(PROT_WRITE, MAP_SHARED)
 *                               and a store through it
 *   fs-probe trunc PATH         open(O_WRONLY | O_TRUNC)
 *   fs-probe mmap-hash PATH     mmap(PROT_READ, MAP_SHARED) the whole file and print its
 *                               length and FNV-1a 64 hash, read through the mapping
 *
 * Each attempt prints `ok` or `refused: <errno name> (<errno>)`; the exit status is 0 when
 * the operation succeeded, 1 when it was refused, 2 on a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static int refused(const char *what)
{
    int e = errno;
    printf("%s refused: %s (%d)\n", what, strerror(e), e);
    return 1;
}

static int mmap_write(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd >= 0) {
        printf("open O_RDWR ok\n");
        close(fd);
        return 0;
    }
    refused("open O_RDWR");
    fd = open(path, O_RDONLY);
    if (fd < 0)
        return refused("open O_RDONLY");
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return refused("mmap PROT_WRITE MAP_SHARED");
    p[0] ^= 0x5a;
    printf("mmap PROT_WRITE MAP_SHARED ok\n");
    return 0;
}

static int mmap_hash(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return refused("open");
    struct stat st;
    if (fstat(fd, &st) != 0)
        return refused("fstat");
    uint64_t h = 0xcbf29ce484222325ULL;
    if (st.st_size > 0) {
        const unsigned char *p = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            return refused("mmap PROT_READ MAP_SHARED");
        for (off_t i = 0; i < st.st_size; i++) {
            h ^= p[i];
            h *= 0x100000001b3ULL;
        }
    }
    printf("%lld %016" PRIx64 "\n", (long long)st.st_size, h);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: fs-probe setxattr|mmap-write|trunc|mmap-hash PATH\n");
        return 2;
    }
    const char *op = argv[1], *path = argv[2];
    if (strcmp(op, "setxattr") == 0) {
        if (setxattr(path, "user.vm", "x", 1, 0) != 0)
            return refused("setxattr");
        printf("setxattr ok\n");
        return 0;
    }
    if (strcmp(op, "mmap-write") == 0)
        return mmap_write(path);
    if (strcmp(op, "trunc") == 0) {
        int fd = open(path, O_WRONLY | O_TRUNC);
        if (fd < 0)
            return refused("open O_TRUNC");
        printf("open O_TRUNC ok\n");
        return 0;
    }
    if (strcmp(op, "mmap-hash") == 0)
        return mmap_hash(path);
    fprintf(stderr, "fs-probe: unknown operation %s\n", op);
    return 2;
}
