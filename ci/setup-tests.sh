#!/usr/bin/env bash
# Installs what only the tests need, on top of ci/setup.sh (the main job's
# set-up): e2fsprogs (the agent's PID-1 guest test builds an ext4 disk), python3
# (the sandbox tests serve from it; its venv module makes the onnx venv), docker-registry and
# skopeo (the OCI tests run a registry on 127.0.0.1), containerd (1.6, with ctr: the shim's
# tests start their own in a temp dir), containernetworking-plugins and iproute2 (the shim's CRI
# tests: a CNI bridge network in a network namespace of their own; curl reaches a pod's port
# from the namespace), protobuf-compiler (protoc:
# the CRI client's build script compiles the CRI protos), mmdebstrap and the Debian python3 + numpy root the
# image-root tests boot (images/rootfs-debian.sh, cached) with the same root as an OCI image
# (images/oci-debian.sh), the rustfmt and clippy components for the lint checks, the host
# onnxruntime venv (~/.cache/vm/venv-onnx: onnx + onnxruntime, the versions
# images/onnx-image.sh pins) and the python + onnxruntime model-server image with its tiny
# model (images/onnx-image.sh, cached), the llama.cpp model-server image, its tiny model and
# the openai client venv (images/llama-server.sh: cmake and g++ build a static llama-server
# once, 8-21 min on 2 shared cores, cached by input hash), and, when the repository has fuzz
# targets, a nightly
# toolchain with cargo-fuzz. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh

say() { echo "setup-tests: $*" >&2; }
die() { echo "setup-tests: ERROR: $*" >&2; exit 1; }

[[ $# -eq 0 || ($# -eq 1 && $1 == --packages) ]] || die "unknown arguments: $* (only --packages)"
ci_timed "setup-tests: apt packages" apt_install_missing setup-tests e2fsprogs python3 python3-venv \
    docker-registry skopeo containerd containernetworking-plugins iproute2 curl protobuf-compiler \
    mmdebstrap cmake g++ make ||
    die "cannot install the packages the tests need"

# `--packages`: only the packages (ci/test-all.sh installs them first: the llama-server build it
# starts at once needs cmake, g++ and make).
[[ ${1:-} != --packages ]] || exit 0

# The longest step, the static llama-server (~11 min of a cold run on 2 cores), runs in the
# background (ci/setup-llama.sh). Under ci/test-all.sh it started before everything else
# ($VM_CI_LLAMA_DIR) and ci/test.sh joins it before the test tiers; run alone, this script
# starts it now, beside the steps below (mostly downloads, dpkg and mmdebstrap, which leave
# the cores idle much of the time), and joins it at the end.
llama_dir=${VM_CI_LLAMA_DIR:-}
llama_own=0
if [[ -z $llama_dir ]]; then
    llama_dir=$(mktemp -d "${TMPDIR:-/tmp}/vm-llama.XXXXXX")
    llama_own=1
    trap 'bash ci/setup-llama.sh --stop "$llama_dir"' EXIT
    bash ci/setup-llama.sh --start "$llama_dir"
fi

# Lints run in ci/test.sh.
start=$SECONDS
for component in clippy rustfmt; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
        say "rustup component add $component"
        rustup component add "$component" || die "rustup component add $component failed"
    fi
done

ci_time "setup-tests: rustup clippy, rustfmt" "$start"

# Fuzzing (only when the repository has fuzz targets): nightly + cargo-fuzz.
start=$SECONDS
if [[ -d fuzz ]]; then
    if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        say "rustup toolchain install nightly"
        # A toolchain comes from outside the package registries: where it cannot be fetched,
        # ci/test.sh reports the fuzz smoke runs as skipped with this reason (counted).
        timeout 300 rustup toolchain install nightly --profile minimal ||
            say "WARNING: no nightly toolchain; the fuzz smoke runs will be skipped"
    fi
    if rustup toolchain list 2>/dev/null | grep -q '^nightly' &&
        ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        say "cargo install cargo-fuzz"
        cargo install cargo-fuzz --locked || die "cargo install cargo-fuzz failed"
    fi
fi
ci_time "setup-tests: nightly toolchain, cargo-fuzz" "$start"

command -v cargo-nextest >/dev/null || say "note: cargo-nextest not installed; ci/test.sh falls back to cargo test"

# build_cached SCRIPT WHAT: build what images/SCRIPT caches unless its --print-path says it is
# there. Root builds it (mmdebstrap root mode, file owners) into this user's cache, where the
# tests look.
build_cached() {
    local script=images/$1 what=$2
    if "$script" --print-path >/dev/null; then
        say "$what present: $("$script" --print-path)"
    elif ((EUID == 0)); then
        "$script" >/dev/null || die "$script failed"
    else
        sudo VM_ROOTFS_DIR="${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/rootfs}" \
            "$script" >/dev/null || die "$script failed"
    fi
}

# The Debian python3 + numpy root the image-root tests boot (about 1.5 min when missing; cached),
# then the same userland packed as an OCI image (seconds), which the --image test and the pull
# benchmark push to a registry on 127.0.0.1.
ci_timed "setup-tests: images/rootfs-debian.sh" build_cached rootfs-debian.sh "Debian rootfs"
ci_timed "setup-tests: images/oci-debian.sh" build_cached oci-debian.sh "Debian OCI image"
# The nested kvm road's L1 runs under QEMU 10 from bookworm-backports (7.2 stalls it), extracted
# apart from the system's QEMU (seconds; cached).
ci_timed "setup-tests: images/qemu-l1.sh" build_cached qemu-l1.sh "the L1's QEMU"

# The model-server test (cli/tests/model_server.rs): onnxruntime on the host, the same version as
# the image's, to compute the answers the guest must match; and the image itself.
start=$SECONDS
onnx_venv=${VM_ONNX_VENV:-$HOME/.cache/vm/venv-onnx}
onnx_pins=$(images/onnx-image.sh --versions)
if ! "$onnx_venv/bin/python" -c 'import onnx, onnxruntime' 2>/dev/null ||
    [[ $(cat "$onnx_venv/.pins" 2>/dev/null) != "$onnx_pins" ]]; then
    say "creating $onnx_venv ($onnx_pins)"
    /usr/bin/python3 -m venv --clear "$onnx_venv" || die "python3 -m venv $onnx_venv failed"
    # shellcheck disable=SC2086 # the pins are separate words
    "$onnx_venv/bin/pip" install --quiet $onnx_pins numpy || die "pip install $onnx_pins failed"
    echo "$onnx_pins" >"$onnx_venv/.pins"
fi
ci_time "setup-tests: onnx venv" "$start"
start=$SECONDS
if ! images/onnx-image.sh --print-path >/dev/null; then
    if ((EUID == 0)); then
        images/onnx-image.sh >/dev/null || die "images/onnx-image.sh failed"
    else
        sudo HOME="$HOME" VM_ONNX_VENV="$onnx_venv" images/onnx-image.sh >/dev/null ||
            die "images/onnx-image.sh failed"
    fi
else
    say "onnxruntime image present: $(images/onnx-image.sh --print-path)"
fi
ci_time "setup-tests: images/onnx-image.sh" "$start"

# The llama.cpp model server the llama test and the llama_serve bench boot: the static
# llama-server (cached by key: sdist version, cmake flags, the build script), then its OCI
# image, the tiny GGUF and the openai client's venv (seconds). Joined here only when this script
# started it.
if ((llama_own)); then
    bash ci/setup-llama.sh --join "$llama_dir" || die "the llama.cpp server image failed"
    rm -rf "$llama_dir"
fi

# The Python SDK (python/, the `vm_sandbox` package): a venv with maturin and pytest
# (~/.cache/vm/venv-sdk, made once), then the abi3 wheel built by `maturin build --release`
# (cargo's own cache makes an unchanged tree a quick rebuild) and installed into that venv,
# where ci/test.sh runs python/tests. The wheel stays in $sdk_venv/wheels for `pip install`.
# The agent tests' frameworks are pinned here too (the official MCP client that drives
# `vm mcp`; the OpenAI Agents SDK and Deep Agents the providers in vm_sandbox.integrations are
# tested with, inside each extra's range in python/pyproject.toml).
sdk_venv=${VM_SDK_VENV:-$HOME/.cache/vm/venv-sdk}
sdk_pins="maturin==1.16.0 pytest==9.2.0 mcp==2.3.0 openai-agents==0.24.0 deepagents==0.7.32"
if ! "$sdk_venv/bin/python" -c 'import maturin, pytest, mcp, agents, deepagents' 2>/dev/null ||
    [[ $(cat "$sdk_venv/.pins" 2>/dev/null) != "$sdk_pins" ]]; then
    say "creating $sdk_venv ($sdk_pins)"
    /usr/bin/python3 -m venv --clear "$sdk_venv" || die "python3 -m venv $sdk_venv failed"
    # shellcheck disable=SC2086 # the pins are separate words
    "$sdk_venv/bin/pip" install --quiet $sdk_pins || die "pip install $sdk_pins failed"
    echo "$sdk_pins" >"$sdk_venv/.pins"
fi
# The wheel carries the VM processes the drivers start (vm-vmm for kvm, vm-vsock and
# vm-virtiofs for tcg's QEMU): a pip-installed SDK finds them in its package (vm_sandbox/bin, git-ignored). They are
# built by the same cargo command as the kvm proof pack's release binaries (ci/kvm-proof.sh
# pack), so that one release build serves both: built apart, each package set resolves its
# dependencies' features differently and cargo compiles them twice (~1 min of a cold run).
sdk_wheel() {
    say "building the Python SDK wheel (maturin build --release)"
    cargo build --release --locked -p vm-cli --bin vm -p vmm --bin vm-vmm --bin vm-vsock \
        --bin vm-virtiofs -p vm-tests --bin vm-kvm-proof >&2 ||
        die "cargo build --release of vm, vm-vmm, vm-vsock, vm-virtiofs and vm-kvm-proof failed"
    mkdir -p python/vm_sandbox/bin
    local b
    for b in vm-vmm vm-vsock vm-virtiofs; do
        install -m 0755 "${CARGO_TARGET_DIR:-target}/release/$b" "python/vm_sandbox/bin/$b" ||
            die "copying $b into python/vm_sandbox/bin failed"
    done
    rm -rf "$sdk_venv/wheels"
    "$sdk_venv/bin/maturin" build --release --quiet -m python/Cargo.toml -i "$sdk_venv/bin/python" \
        --out "$sdk_venv/wheels" >&2 || die "maturin build of python/ failed"
    "$sdk_venv/bin/pip" install --quiet --force-reinstall --no-deps "$sdk_venv"/wheels/vm_sandbox-*.whl ||
        die "pip install of the vm_sandbox wheel failed"
    say "Python SDK installed in $sdk_venv: $(basename "$sdk_venv"/wheels/vm_sandbox-*.whl)"
}
ci_timed "setup-tests: the Python SDK wheel (release builds, maturin)" sdk_wheel

# critest, Kubernetes' CRI conformance suite: Go 1.23 from bookworm-backports, critest from the
# kit's vendored source (../shared/critest) and its test images, each cached under
# ~/.cache/vm/critest keyed by its inputs (ci/critest.sh, which times itself); ci/test.sh runs it.
bash ci/critest.sh build || die "ci/critest.sh build failed"
