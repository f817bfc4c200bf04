#!/usr/bin/env bash
# The llama.cpp model-server image and its tiny test model, built offline from the package
# registries and cached:
#   - images/llama/build-server.sh: a fully static `llama-server` from the llama.cpp tree in
#     llama-cpp-python's source distribution (the long step, ~15 min on 2 cores, cached by
#     its own key);
#   - an OCI image layout (images/oci-pack.py) with a minimal root: /usr/local/bin/llama-server, an /etc/passwd and
#     /etc/group with the non-root user `llama` (uid/gid 1000), /tmp (1777), /models (the mount
#     point); the image's User is `llama`, its Entrypoint the server (`vm images import` takes it);
#   - models/tiny.gguf: a 2-layer, 64-dimension llama model with random weights from a fixed
#     seed and the sdist's llama SentencePiece vocabulary (images/llama/make-tiny-gguf.py, with
#     the `gguf` package), meant to be mounted read-only at /models;
#   - a Python venv (${VM_LLAMA_VENV:-~/.cache/vm/venv-llama}) with `gguf` and the `openai`
#     client the tests use; `python` in the output directory runs its interpreter.
#
#   images/llama-server.sh               build what is missing; print the output directory
#   images/llama-server.sh --print-path  print the directory if built, else exit 1 (builds nothing)
#   images/llama-server.sh --force       rebuild the image and the model (not the binary)
#
# Output: ${VM_LLAMA_DIR:-~/.cache/vm/llama}/image-<key>/{oci/,models/tiny.gguf,python,manifest.json}
# where <key> hashes the binary, this script, the model generator and oci-pack.py. Everything in it is
# deterministic (fixed mtimes, owners, seed): the same inputs give the same image digest.
set -euo pipefail

say() { echo "llama-image: $*" >&2; }
die() { echo "llama-image: ERROR: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv_packages=(gguf==0.19.0 openai==3.51.0)
vocab=ggml-vocab-llama-spm.gguf

# shellcheck source=../ci/lib.sh
source "$here/../ci/lib.sh"
cache_args llama-image "$@"

cache=${VM_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/llama}
venv=${VM_LLAMA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/venv-llama}
if ((CACHE_PRINT_ONLY)); then
    bin_dir=$("$here/llama/build-server.sh" --print-path) || exit 1
else
    server_start=$SECONDS
    bin_dir=$("$here/llama/build-server.sh") || die "building llama-server failed"
    ci_time "images: llama/build-server.sh (llama-server, cached by key)" "$server_start"
fi
bin_sum=$(sha256sum "$bin_dir/bin/llama-server" | cut -d' ' -f1)
key=$( {
    echo "$bin_sum" "${venv_packages[*]}" "$vocab"
    cat "${BASH_SOURCE[0]}" "$here/llama/make-tiny-gguf.py" "$here/oci-pack.py"
} | sha256sum | cut -c1-16)
dir=$cache/image-$key

built() { [[ -f $dir/manifest.json && -f $dir/models/tiny.gguf && -x $dir/python && -x $venv/bin/python ]]; }
cache_hit "$dir" built

# The venv: created when missing, the pinned packages installed when absent.
ensure_venv() {
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv" || die "python3 -m venv failed (python3-venv missing?)"
    local want=() p
    for p in "${venv_packages[@]}"; do
        [[ $("$venv/bin/pip" show "${p%%==*}" 2>/dev/null) == *$'\nVersion: '"${p#*==}"$'\n'* ]] || want+=("$p")
    done
    if ((${#want[@]})); then
        say "pip install ${want[*]} into $venv"
        "$venv/bin/pip" install --quiet "${want[@]}" || die "pip install ${want[*]} failed"
    fi
}

cache_lock "$cache/.image.lock" "$dir" built
ensure_venv

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

say "generating the tiny GGUF model"
mkdir -p "$tmp/out/models"
"$venv/bin/python" "$here/llama/make-tiny-gguf.py" "$bin_dir/models/$vocab" "$tmp/out/models/tiny.gguf" ||
    die "make-tiny-gguf.py failed"

say "packing the OCI image"
root=$tmp/root
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$root/models"
install -m 0755 "$bin_dir/bin/llama-server" "$root/usr/local/bin/llama-server"
printf 'root:x:0:0:root:/root:/sbin/nologin\nllama:x:1000:1000:llama:/tmp:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nllama:x:1000:\n' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
chmod 1777 "$root/tmp"
chmod 0755 "$root/models" "$root/usr" "$root/usr/local" "$root/usr/local/bin" "$root/etc"
# Fixed mtimes and root owners: the same inputs give the same image digest.
find "$root" -exec touch -h -d @0 {} +
config='{"User":"llama","Env":["PATH=/usr/local/bin:/usr/bin:/bin","HOME=/tmp"],"Entrypoint":["/usr/local/bin/llama-server"],"Cmd":["-m","/models/tiny.gguf","--host","127.0.0.1","--port","8080"],"WorkingDir":"/tmp","ExposedPorts":{"8080/tcp":{}}}'
manifest_digest=$(python3 "$here/oci-pack.py" "$root" "$tmp/out/oci" latest "$config") ||
    die "oci-pack.py failed"
# A wrapper, not a link: python finds its venv from the path it was started by.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$venv/bin/python" >"$tmp/out/python"
chmod 0755 "$tmp/out/python"
model_sum=$(sha256sum "$tmp/out/models/tiny.gguf" | cut -d' ' -f1)
cat >"$tmp/out/manifest.json" <<EOF
{
  "server": "$bin_dir/bin/llama-server",
  "server_sha256": "$bin_sum",
  "image_manifest_digest": "$manifest_digest",
  "model": {"name": "models/tiny.gguf", "sha256": "$model_sum", "vocabulary": "$vocab"},
  "venv": "$venv",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_seconds": $((SECONDS - start))
}
EOF
rm -rf "$dir"
mv "$tmp/out" "$dir"
# Older outputs of this script (other keys) are stale: keep only this one.
for old in "$cache"/image-*; do
    [[ $old == "$dir" ]] || rm -rf "$old"
done
say "built $dir (image $manifest_digest)"
echo "$dir"
