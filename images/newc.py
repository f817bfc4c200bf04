#!/usr/bin/env python3
"""Writes an initramfs (uncompressed newc cpio) from a gen_init_cpio-style spec.

    images/newc.py SPEC > initramfs.cpio

One entry a line: `dir NAME MODE UID GID`, `nod NAME MODE UID GID c|b MAJ MIN`,
`file NAME SRC MODE UID GID`, `slink NAME TARGET MODE UID GID`. Every mtime is 0, so the
archive depends only on the spec and the files' bytes. Device nodes need no privilege: they are
written as archive entries, never created on the host. Any malformed line is an error naming it.
"""
import stat
import sys

TYPES = {"dir": stat.S_IFDIR, "nod": 0, "file": stat.S_IFREG, "slink": stat.S_IFLNK}


def die(msg):
    sys.exit(f"newc: ERROR: {msg}")


def entry(out, ino, name, mode, uid, gid, data=b"", rdev=(0, 0), nlink=1, dev=(3, 1)):
    name_b = name.lstrip("/").encode() + b"\0"
    fields = [ino, mode, uid, gid, nlink, 0, len(data), dev[0], dev[1], rdev[0], rdev[1],
              len(name_b), 0]
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + name_b
    head += b"\0" * (-len(head) % 4)
    out.write(head + data + b"\0" * (-len(data) % 4))
    return len(head) + len(data) + (-len(data) % 4)


def main():
    if len(sys.argv) != 2:
        die("usage: images/newc.py SPEC > initramfs.cpio")
    out = sys.stdout.buffer
    written = 0
    ino = 721  # as gen_init_cpio numbers them (and its device 3:1): the same bytes as its archive
    for n, line in enumerate(open(sys.argv[1]), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        kind = words[0]
        want = {"dir": 5, "nod": 8, "file": 6, "slink": 6}.get(kind)
        if want is None or len(words) != want:
            die(f"{sys.argv[1]}:{n}: bad entry: {line.strip()!r}")
        name = words[1]
        try:
            if kind == "dir":
                mode, uid, gid = int(words[2], 8), int(words[3]), int(words[4])
                written += entry(out, ino, name, stat.S_IFDIR | mode, uid, gid, nlink=2)
            elif kind == "nod":
                mode, uid, gid = int(words[2], 8), int(words[3]), int(words[4])
                if words[5] not in ("c", "b"):
                    die(f"{sys.argv[1]}:{n}: device type must be c or b")
                t = stat.S_IFCHR if words[5] == "c" else stat.S_IFBLK
                written += entry(out, ino, name, t | mode, uid, gid, rdev=(int(words[6]), int(words[7])))
            elif kind == "file":
                mode, uid, gid = int(words[3], 8), int(words[4]), int(words[5])
                with open(words[2], "rb") as f:
                    data = f.read()
                written += entry(out, ino, name, stat.S_IFREG | mode, uid, gid, data=data)
            else:
                mode, uid, gid = int(words[3], 8), int(words[4]), int(words[5])
                written += entry(out, ino, name, stat.S_IFLNK | mode, uid, gid, data=words[2].encode() + b"\0")
        except ValueError as e:
            die(f"{sys.argv[1]}:{n}: {e}")
        except OSError as e:
            die(f"{sys.argv[1]}:{n}: {e}")
        ino += 1
    written += entry(out, 0, "TRAILER!!!", 0, 0, 0, nlink=1, dev=(0, 0))
    out.write(b"\0" * (-written % 512))


if __name__ == "__main__":
    main()
