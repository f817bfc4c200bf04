#!/usr/bin/env bash
# Packs the Debian python3 + numpy userland of images/rootfs-debian.sh as an OCI image layout
# (one uncompressed layer, a config with Env, WorkingDir, User app and a Cmd that prints numpy's
# arange(6).sum()), for the tests and the benchmark that push it to a registry on 127.0.0.1,
# pull it and boot it with `--image`.
#
#   images/oci-debian.sh               build if missing (and the rootfs first); print DIR:TAG
#   images/oci-debian.sh --print-path  print DIR:TAG if built, else exit 1 (builds nothing)
#   images/oci-debian.sh --force       rebuild the layout (not the rootfs)
#
# The tree is the rootfs's own erofs, extracted with fsck.erofs (owners and modes kept), so the
# image holds exactly the files the --rootfs tests boot; packed by images/oci-pack.py. Cached in
# ${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-~/.cache}/vm/rootfs}/oci-<key>/, <key> hashing this script,
# oci-pack.py and the rootfs image's sha256; built in a temporary directory and renamed when complete.
# Needs root (file owners in the layer), erofs-utils, GNU tar and python3.
set -euo pipefail

say() { echo "oci-debian: $*" >&2; }
die() { echo "oci-debian: ERROR: $*" >&2; exit 1; }

tag=bookworm-numpy
here=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=../ci/lib.sh
source "$here/../ci/lib.sh"
cache_args oci-debian "$@"
if ((CACHE_PRINT_ONLY)); then
    rootfs=$("$here/rootfs-debian.sh" --print-path) || exit 1
else
    rootfs=$("$here/rootfs-debian.sh") || die "images/rootfs-debian.sh failed"
fi
rootfs_dir=$(dirname "$rootfs")
rootfs_sum=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["file"]["sha256"])' \
    "$rootfs_dir/manifest.json") || die "cannot read $rootfs_dir/manifest.json"
key=$({ cat "${BASH_SOURCE[0]}" "$here/oci-pack.py"; echo "$rootfs_sum"; } | sha256sum | cut -c1-16)
cache=$(dirname "$rootfs_dir")
dir=$cache/oci-$key
built() { [[ -f $dir/index.json ]]; }
cache_hit "$dir:$tag" built

((EUID == 0)) || die "needs root (file owners in the layer)"
command -v fsck.erofs >/dev/null || die "fsck.erofs missing (apt-get install erofs-utils)"

cache_lock "$cache/.lock-oci" "$dir:$tag" built

tmp=$(mktemp -d "$cache/.tmp-oci.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
say "extracting $rootfs"
fsck.erofs --extract="$tmp/root" --preserve "$rootfs" >/dev/null || die "fsck.erofs --extract failed"
# Device nodes have no place in an image (the importer drops them anyway).
find "$tmp/root" \( -type b -o -type c \) -delete

out=$tmp/out
say "packing the layer"
config='{"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
         "WorkingDir": "/home/app", "User": "app",
         "Cmd": ["python3", "-c", "import numpy; print(numpy.arange(6).sum())"]}'
python3 "$here/oci-pack.py" "$tmp/root" "$out" "$tag" "$config" >/dev/null ||
    die "images/oci-pack.py failed"

rm -rf "$dir"
mv "$out" "$dir"
size=$(du -sm "$dir" | cut -f1)
say "built $dir ($size MiB, $((SECONDS - start)) s)"
echo "$dir:$tag"
