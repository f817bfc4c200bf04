#!/usr/bin/env bash
# Builds (once) a fully static llama.cpp `llama-server` from the llama.cpp tree that the
# llama-cpp-python source distribution carries (pinned below), for the llama.cpp model-server
# image (images/llama-server.sh).
#
#   images/llama/build-server.sh               build if missing; print the cache directory
#   images/llama/build-server.sh --print-path  print the directory if built, else exit 1
#   images/llama/build-server.sh --force       rebuild
#
# The directory holds bin/llama-server, the sdist's models/ggml-vocab-*.gguf vocabularies
# (the tiny test model takes its vocabulary from there), the sdist's gguf-py and a manifest.
# Cached in ${VM_LLAMA_DIR:-${XDG_CACHE_HOME:-~/.cache}/vm/llama}/<key>, where <key> hashes the
# sdist version, the cmake flags and this script; a build happens in a temporary directory and is
# renamed into place only when complete, under a lock. About 15 min on 2 idle cores.
# Needs cmake, g++, make and python3 with venv (the sdist is fetched with pip).
set -euo pipefail

say() { echo "llama-build: $*" >&2; }
die() { echo "llama-build: ERROR: $*" >&2; exit 1; }

sdist_version=0.3.36
# The sdist's sha256 as first fetched: a registry file that changed under the same version is
# refused rather than built.
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# No native tuning and no AVX family: the binary must run under QEMU TCG and in a guest whose
# kernel hides AVX (noxsave); SSE4.2 is the baseline. No OpenSSL, no OpenMP, no web UI download.
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_OPENMP=OFF
    -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DCMAKE_EXE_LINKER_FLAGS=-static
)

# shellcheck source=../../ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../ci/lib.sh"
cache_args llama-build "$@"

cache=${VM_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/llama}
key=$( {
    echo "$sdist_version $sdist_sha256"
    printf '%s\n' "${cmake_flags[@]}"
    cat "${BASH_SOURCE[0]}"
} | sha256sum | cut -c1-16)
dir=$cache/$key

built() { [[ -f $dir/manifest.json && -x $dir/bin/llama-server ]]; }
cache_hit "$dir" built

for tool in cmake g++ make python3; do
    command -v "$tool" >/dev/null || die "$tool missing (ci/setup-tests.sh installs it)"
done

cache_lock "$cache/.lock" "$dir" built

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

say "fetching the llama-cpp-python $sdist_version source distribution"
python3 -m venv "$tmp/venv" || die "python3 -m venv failed (python3-venv missing?)"
"$tmp/venv/bin/pip" download --quiet --no-binary :all: --no-deps \
    "llama-cpp-python==$sdist_version" -d "$tmp/sdist" || die "pip download failed"
sdist=("$tmp"/sdist/llama_cpp_python-"$sdist_version".tar.gz)
[[ -f ${sdist[0]} ]] || die "no sdist in $tmp/sdist"
sdist_sha=$(sha256sum "${sdist[0]}" | cut -d' ' -f1)
[[ $sdist_sha == "$sdist_sha256" ]] ||
    die "llama-cpp-python $sdist_version sdist has sha256 $sdist_sha, expected $sdist_sha256"
tar -xzf "${sdist[0]}" -C "$tmp" || die "cannot unpack ${sdist[0]}"
src=$tmp/llama_cpp_python-$sdist_version/vendor/llama.cpp
[[ -f $src/CMakeLists.txt ]] || die "the sdist has no vendor/llama.cpp"

say "cmake configure (${cmake_flags[*]})"
cmake -S "$src" -B "$tmp/build" "${cmake_flags[@]}" >"$tmp/configure.log" 2>&1 ||
    { tail -30 "$tmp/configure.log" >&2; die "cmake configure failed"; }
say "building llama-server with $(nproc) jobs (about 15 min on 2 cores)"
cmake --build "$tmp/build" --target llama-server -j "$(nproc)" >"$tmp/build.log" 2>&1 ||
    { tail -40 "$tmp/build.log" >&2; die "build failed"; }

bin=$tmp/build/bin/llama-server
[[ -x $bin ]] || die "no $bin after the build"
file_out=$(file -b "$bin" 2>/dev/null || true)
if ldd "$bin" >/dev/null 2>&1; then
    die "llama-server is dynamically linked ($file_out)"
fi
mkdir -p "$tmp/out/bin" "$tmp/out/models"
strip -o "$tmp/out/bin/llama-server" "$bin" || die "strip failed"
cp "$src"/models/ggml-vocab-*.gguf "$tmp/out/models/"
cp -r "$src/gguf-py" "$tmp/out/gguf-py"
sum=$(sha256sum "$tmp/out/bin/llama-server" | cut -d' ' -f1)
size=$(stat -c %s "$tmp/out/bin/llama-server")
cat >"$tmp/out/manifest.json" <<EOF
{
  "sdist": "llama-cpp-python==$sdist_version",
  "sdist_sha256": "$sdist_sha",
  "cmake_flags": "${cmake_flags[*]}",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_seconds": $((SECONDS - start)),
  "compiler": "$(g++ --version | head -1)",
  "file": {"name": "bin/llama-server", "sha256": "$sum", "size": $size}
}
EOF
rm -rf "$dir"
mv "$tmp/out" "$dir"
say "built $dir/bin/llama-server ($((size / 1048576)) MiB, $((SECONDS - start)) s)"
echo "$dir"
