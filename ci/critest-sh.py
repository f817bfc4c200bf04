#!/usr/bin/env python3
"""Gives critest's busybox image a /bin/sh that runs commands by exec, as upstream's does.

    ci/critest-sh.py MKIMAGES BUSYBOX

Edits MKIMAGES (ci/critest.sh's copy of the kit's mkimages.py, never the kit) so that the base
busybox layer's /bin/sh is BUSYBOX, Debian's dynamically linked busybox, with the libraries
`ldd` names for it; every other applet stays a link to busybox-static.

Why: busybox-static is built with FEATURE_SH_STANDALONE, so its `sh -c ls` runs the `ls`
applet in the shell's own process and never executes /bin/ls. critest's MaskedPaths spec masks
/bin/ls (our agent binds /dev/null over it) and expects `sh -c ls` to fail with
"/bin/sh: ls: Permission denied", which only a shell that execs by PATH can say; the image
critest names upstream (registry.k8s.io/e2e-test-images/busybox:1.29-2) has such a shell. The
edit is checked against the text it replaces, so a changed kit stops this loudly.
"""
import subprocess
import sys

ANCHOR = '''        if a != "busybox" and "/" not in a:
            l.hardlink("bin/" + a, "bin/busybox")
'''


def libraries(binary):
    """The absolute paths of the shared objects `ldd` lists for BINARY, loader included."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    paths = []
    for line in out.splitlines():
        words = line.split()
        if "=>" in words:
            target = words[words.index("=>") + 1]
            if target.startswith("/"):
                paths.append(target)
        elif words and words[0].startswith("/"):
            paths.append(words[0])
    if not any("ld-linux" in p for p in paths) or not any("libc.so" in p for p in paths):
        sys.exit(f"critest-sh: ldd {binary} named no loader or libc: {out!r}")
    return paths


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    mkimages, busybox = sys.argv[1], sys.argv[2]
    text = open(mkimages).read()
    if text.count(ANCHOR) != 1:
        sys.exit(f"critest-sh: {mkimages} no longer builds its busybox links as expected")
    libs = libraries(busybox)
    dirs = sorted({p.rsplit("/", 1)[0].lstrip("/") for p in libs})
    parents = sorted({d.split("/")[0] for d in dirs} | set(dirs), key=len)
    added = [ANCHOR.replace('a != "busybox"', 'a not in ("busybox", "sh")'),
             "    # ci/critest-sh.py: /bin/sh is Debian's dynamic busybox, which execs by PATH.\n"]
    added += [f"    l.dir({d!r}, 0o755)\n" for d in parents]
    added += [f"    l.file({p.lstrip('/')!r}, open({p!r}, 'rb').read(), 0o755)\n" for p in libs]
    added.append(f"    l.file('bin/sh', open({busybox!r}, 'rb').read(), 0o755)\n")
    open(mkimages, "w").write(text.replace(ANCHOR, "".join(added)))


if __name__ == "__main__":
    main()
