#!/usr/bin/env bash
# Builds (once) the python + onnxruntime model-server image and its tiny model:
# a Debian bookworm root (mmdebstrap: python3 + numpy, docs/man/locales excluded, a user `app`
# 1000:1000), the onnxruntime wheel unpacked into /usr/local/lib/python3.11/dist-packages,
# images/onnx/server.py as /app/server.py (Entrypoint `python3 /app/server.py`, Cmd
# `--model /models/tiny.onnx --port 8000`, User app), packed as a one-layer OCI image layout;
# and models/tiny.onnx, written by images/onnx/make-model.py with the `onnx` package. The model
# is NOT in the image: it is mounted read-only (`-v DIR/models:/models:ro`).
#
#   images/onnx-image.sh              build if missing; print the output directory
#   images/onnx-image.sh --print-path print the directory if built, else exit 1 (builds nothing)
#   images/onnx-image.sh --force      rebuild
#   images/onnx-image.sh --versions   print the pinned onnxruntime and onnx versions
#
# Output: ${VM_ONNX_DIR:-~/.cache/vm/onnx}/<key>/{oci/, models/tiny.onnx, manifest.json}, where
# <key> hashes this script, debian-root.sh, server.py, make-model.py, oci-pack.py and the pinned versions. The
# wheel is cached in ~/.cache/vm/wheels/. Needs root (mmdebstrap), mmdebstrap, GNU tar and the
# host venv with onnx + onnxruntime that ci/setup-tests.sh creates ($VM_ONNX_VENV, default
# ~/.cache/vm/venv-onnx); the host's onnxruntime there is the same version as the image's.
set -euo pipefail

say() { echo "onnx-image: $*" >&2; }
die() { echo "onnx-image: ERROR: $*" >&2; exit 1; }

ORT_VERSION=1.32.0
ONNX_VERSION=1.23.2
suite=bookworm
packages=python3,python3-numpy,libstdc++6
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=debian-root.sh
source "$here/debian-root.sh"
venv=${VM_ONNX_VENV:-$HOME/.cache/vm/venv-onnx}
wheels=${VM_WHEELS_DIR:-$HOME/.cache/vm/wheels}
mirror=${VM_ROOTFS_MIRROR:-}

if [[ ${1:-} == --versions ]]; then
    echo "onnxruntime==$ORT_VERSION onnx==$ONNX_VERSION"
    exit 0
fi
# shellcheck source=../ci/lib.sh
source "$here/../ci/lib.sh"
cache_args onnx-image "$@"

cache=${VM_ONNX_DIR:-$HOME/.cache/vm/onnx}
key=$( (cat "${BASH_SOURCE[0]}" "$here/debian-root.sh" "$here/onnx/server.py" "$here/onnx/make-model.py" "$here/oci-pack.py"
        echo "$ORT_VERSION $ONNX_VERSION $suite $packages") | sha256sum | cut -c1-16)
dir=$cache/$key
built() { [[ -f $dir/manifest.json ]]; }
cache_hit "$dir" built

((EUID == 0)) || die "needs root (mmdebstrap root mode, file owners in the image)"
command -v mmdebstrap >/dev/null || die "mmdebstrap missing (apt-get install mmdebstrap)"
[[ -x $venv/bin/python ]] || die "no venv at $venv (ci/setup-tests.sh creates it)"
"$venv/bin/python" -c "import onnx, onnxruntime; assert onnxruntime.__version__ == '$ORT_VERSION', onnxruntime.__version__" ||
    die "$venv lacks onnx / onnxruntime $ORT_VERSION"

mkdir -p "$wheels"
cache_lock "$cache/.lock" "$dir" built
start=$SECONDS
wheel=$(ls "$wheels"/onnxruntime-"$ORT_VERSION"-cp311-cp311-manylinux*x86_64.whl 2>/dev/null | head -1 || true)
if [[ -z $wheel ]]; then
    say "downloading the onnxruntime $ORT_VERSION wheel (cp311, x86-64)"
    "$venv/bin/pip" download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
        --python-version 3.11 --implementation cp --abi cp311 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
        "onnxruntime==$ORT_VERSION" || die "pip download onnxruntime==$ORT_VERSION failed"
    wheel=$(ls "$wheels"/onnxruntime-"$ORT_VERSION"-cp311-cp311-manylinux*x86_64.whl | head -1)
fi

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
site=usr/local/lib/python3.11/dist-packages
say "mmdebstrap $suite with $packages and $(basename "$wheel") (about 2 min)"
debian_root "$suite" "$packages" "$tmp/root" "$mirror" ||
    die "mmdebstrap failed"

# The wheel is a zip of its installed tree (platlib): unpack it where Debian's python3 looks.
mkdir -p "$tmp/root/$site"
"$venv/bin/python" -m zipfile -e "$wheel" "$tmp/root/$site" || die "unpacking the wheel failed"
rm -rf "$tmp/root/$site"/onnxruntime/{tools,transformers,quantization,datasets}
mkdir -p "$tmp/root/models" "$tmp/root/app"
install -m 0644 "$here/onnx/server.py" "$tmp/root/app/server.py"
chown -R 0:0 "$tmp/root/$site" "$tmp/root/app"
chmod -R u=rwX,go=rX "$tmp/root/$site"

mkdir -p "$tmp/out/models"
"$venv/bin/python" "$here/onnx/make-model.py" "$tmp/out/models/tiny.onnx" || die "make-model.py failed"
chmod 0444 "$tmp/out/models/tiny.onnx"
config='{"User": "app", "WorkingDir": "/app",
  "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
  "Entrypoint": ["python3", "/app/server.py"],
  "Cmd": ["--model", "/models/tiny.onnx", "--host", "127.0.0.1", "--port", "8000"],
  "ExposedPorts": {"8000/tcp": {}}}'
ref=vm.local/onnx-server:$key
manifest=$(python3 "$here/oci-pack.py" "$tmp/root" "$tmp/out/oci" "$ref" "$config") || die "oci-pack.py failed"
model_sum=$(sha256sum "$tmp/out/models/tiny.onnx" | cut -d' ' -f1)
cat >"$tmp/out/manifest.json" <<EOF2
{
  "ref": "$ref",
  "manifest_digest": "$manifest",
  "onnxruntime": "$ORT_VERSION",
  "onnx": "$ONNX_VERSION",
  "suite": "$suite",
  "packages": "$packages",
  "wheel": "$(basename "$wheel")",
  "model": {"name": "tiny.onnx", "sha256": "$model_sum"},
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_seconds": $((SECONDS - start))
}
EOF2
rm -rf "$dir"
mv "$tmp/out" "$dir"
say "built $dir ($(du -sm "$dir" | cut -f1) MiB, $((SECONDS - start)) s)"
echo "$dir"
