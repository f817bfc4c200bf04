#!/usr/bin/env bash
# Builds (once) a real Debian userland as a read-only erofs root for `vm --rootfs`:
# bookworm with python3-minimal and python3-numpy (docs, man pages and locales excluded),
# plus a non-root user `app` (uid/gid 1000). The image tests boot it as the guest's root.
#
#   images/rootfs-debian.sh               build if missing; print the image path
#   images/rootfs-debian.sh --print-path  print the path if built, else exit 1 (builds nothing)
#   images/rootfs-debian.sh --force       rebuild
#
# Cached in ${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-~/.cache}/vm/rootfs}/<key>/rootfs.erofs, where
# <key> hashes this script and images/debian-root.sh (package list, hooks, mkfs options). A build happens in a
# temporary directory next to it and is renamed into place only when complete, under a lock.
# Needs root (mmdebstrap's root mode), mmdebstrap, erofs-utils and a Debian mirror.
set -euo pipefail

say() { echo "rootfs: $*" >&2; }
die() { echo "rootfs: ERROR: $*" >&2; exit 1; }

suite=bookworm
packages=python3-minimal,python3-numpy
mirror=${VM_ROOTFS_MIRROR:-}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../ci/lib.sh
source "$here/../ci/lib.sh"
cache_args rootfs "$@"

cache=${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/rootfs}
# shellcheck source=debian-root.sh
source "$here/debian-root.sh"
key=$(cat "${BASH_SOURCE[0]}" "$here/debian-root.sh" | sha256sum | cut -c1-16)
dir=$cache/$key
image=$dir/rootfs.erofs
built() { [[ -f $dir/manifest.json && -f $image ]]; }
cache_hit "$image" built

((EUID == 0)) || die "needs root (mmdebstrap root mode, file owners in the image)"
command -v mmdebstrap >/dev/null || die "mmdebstrap missing (apt-get install mmdebstrap)"
command -v mkfs.erofs >/dev/null || die "mkfs.erofs missing (apt-get install erofs-utils)"

cache_lock "$cache/.lock" "$image" built

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
say "mmdebstrap $suite with $packages (about 1.5 min)"
# Services must not start while packages install: a policy-rc.d that refuses, removed after.
debian_root "$suite" "$packages" "$tmp/root" "$mirror" ||
    die "mmdebstrap failed"

mkdir -p "$tmp/out"
# Uncompressed: the guest reads it without decompression work (slow under emulation).
mkfs.erofs --quiet "$tmp/out/rootfs.erofs" "$tmp/root" >/dev/null || die "mkfs.erofs failed"
sum=$(sha256sum "$tmp/out/rootfs.erofs" | cut -d' ' -f1)
size=$(stat -c %s "$tmp/out/rootfs.erofs")
cat >"$tmp/out/manifest.json" <<EOF
{
  "suite": "$suite",
  "packages": "$packages",
  "user": "app:1000:1000",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_seconds": $((SECONDS - start)),
  "mmdebstrap": "$(dpkg-query -W -f='${Version}' mmdebstrap 2>/dev/null || echo unknown)",
  "erofs_utils": "$(dpkg-query -W -f='${Version}' erofs-utils 2>/dev/null || echo unknown)",
  "file": {"name": "rootfs.erofs", "sha256": "$sum", "size": $size}
}
EOF
rm -rf "$dir"
mv "$tmp/out" "$dir"
say "built $image ($((size / 1048576)) MiB, $((SECONDS - start)) s)"
echo "$image"
