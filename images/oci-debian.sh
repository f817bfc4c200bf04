#!/usr/bin/env bash
# Packs the Debian python3 + numpy userland of images/rootfs-debian.sh as an OCI image layout
# (one gzip layer, a config with Env, WorkingDir, User app and a Cmd that prints numpy's
# arange(6).sum()), for the tests and the benchmark that push it to a registry on 127.0.0.1,
# pull it and boot it with `--image`.
#
#   images/oci-debian.sh               build if missing (and the rootfs first); print DIR:TAG
#   images/oci-debian.sh --print-path  print DIR:TAG if built, else exit 1 (builds nothing)
#   images/oci-debian.sh --force       rebuild the layout (not the rootfs)
#
# The tree is the rootfs's own erofs, extracted with fsck.erofs (owners and modes kept), so the
# image holds exactly the files the --rootfs tests boot. Cached in
# ${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-~/.cache}/vm/rootfs}/oci-<key>/, <key> hashing this script
# and the rootfs image's sha256; built in a temporary directory and renamed when complete.
# Needs root (file owners in the layer), erofs-utils, tar, gzip and python3 (the JSON).
set -euo pipefail

say() { echo "oci-debian: $*" >&2; }
die() { echo "oci-debian: ERROR: $*" >&2; exit 1; }

tag=bookworm-numpy
(($# <= 1)) || die "one argument at most (--print-path or --force)"
force=0 print_only=0
[[ ${1:-} != --force ]] || force=1
[[ ${1:-} != --print-path ]] || print_only=1
[[ -z ${1:-} || $force == 1 || $print_only == 1 ]] || die "unknown argument $1 (use --print-path or --force)"

here=$(dirname "${BASH_SOURCE[0]}")
if ((print_only)); then
    rootfs=$("$here/rootfs-debian.sh" --print-path) || exit 1
else
    rootfs=$("$here/rootfs-debian.sh") || die "images/rootfs-debian.sh failed"
fi
rootfs_dir=$(dirname "$rootfs")
rootfs_sum=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["file"]["sha256"])' \
    "$rootfs_dir/manifest.json") || die "cannot read $rootfs_dir/manifest.json"
key=$({ sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; echo "$rootfs_sum"; } | sha256sum | cut -c1-16)
cache=$(dirname "$rootfs_dir")
dir=$cache/oci-$key

if ((!force)) && [[ -f $dir/index.json ]]; then
    echo "$dir:$tag"
    exit 0
fi
((print_only)) && exit 1

((EUID == 0)) || die "needs root (file owners in the layer)"
command -v fsck.erofs >/dev/null || die "fsck.erofs missing (apt-get install erofs-utils)"

exec 9>"$cache/.lock-oci"
flock 9
if ((!force)) && [[ -f $dir/index.json ]]; then
    echo "$dir:$tag"
    exit 0
fi

tmp=$(mktemp -d "$cache/.tmp-oci.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
say "extracting $rootfs"
fsck.erofs --extract="$tmp/root" --preserve "$rootfs" >/dev/null || die "fsck.erofs --extract failed"
# Device nodes have no place in an image (the importer drops them anyway).
find "$tmp/root" \( -type b -o -type c \) -delete

out=$tmp/out
mkdir -p "$out/blobs/sha256"
say "packing the layer"
(cd "$tmp/root" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort |
    tar --numeric-owner --sort=name -cf - -T -) >"$tmp/layer.tar" || die "tar failed"
diff_id=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
gzip -n -6 "$tmp/layer.tar"

python3 - "$out" "$tmp/layer.tar.gz" "$diff_id" "$tag" <<'EOF' || die "writing the layout failed"
import hashlib, json, os, sys

out, layer, diff_id, tag = sys.argv[1:]

def blob(data):
    d = hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", d), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + d, "size": len(data)}

h = hashlib.sha256()
with open(layer, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
layer_digest = h.hexdigest()
os.rename(layer, os.path.join(out, "blobs", "sha256", layer_digest))
config = {
    "architecture": "amd64",
    "os": "linux",
    "config": {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/home/app",
        "User": "app",
        "Cmd": ["python3", "-c", "import numpy; print(numpy.arange(6).sum())"],
    },
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
}
cfg = blob(json.dumps(config, sort_keys=True).encode())
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
    "layers": [{
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": "sha256:" + layer_digest,
        "size": os.path.getsize(os.path.join(out, "blobs", "sha256", layer_digest)),
    }],
}
m = blob(json.dumps(manifest, sort_keys=True).encode())
index = {
    "schemaVersion": 2,
    "manifests": [dict(m, mediaType=manifest["mediaType"],
                       annotations={"org.opencontainers.image.ref.name": tag})],
}
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump(index, f)
with open(os.path.join(out, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
EOF

rm -rf "$dir"
mv "$out" "$dir"
size=$(du -sm "$dir" | cut -f1)
say "built $dir ($size MiB, $((SECONDS - start)) s)"
echo "$dir:$tag"
