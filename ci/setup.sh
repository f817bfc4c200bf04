#!/usr/bin/env bash
# Installs what building and running `vm` needs on a Debian 12 x86_64 machine
# (the main job's set-up), then builds the guest images. Test-only tooling
# (rustfmt, clippy, the nightly toolchain, cargo-fuzz) is ci/setup-tests.sh's.
# `ci/setup.sh --packages` installs only the apt packages. Idempotent and quick
# when all is present: apt-get runs (after `apt-get update`) only for missing
# packages. The tcg driver's vsock backend is ours (`vm-vsock`, built with the
# workspace), so nothing is installed with cargo here. `--first-vm-packages` installs only
# what the main job's first VM needs (no kernel toolchain: it boots Debian's kernel).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh

say() { echo "setup: $*" >&2; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

first_vm_packages=(qemu-system-x86 busybox-static erofs-utils cpio binutils python3
    build-essential)
packages=("${first_vm_packages[@]}" lz4 linux-source-6.12 bc flex bison libelf-dev libssl-dev
    patch)

[[ $# -eq 0 || ($# -eq 1 && ($1 == --packages || $1 == --first-vm-packages)) ]] ||
    die "unknown arguments: $* (only --packages or --first-vm-packages)"
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (stable)"
if [[ ${1:-} == --first-vm-packages ]]; then
    ci_timed "setup: apt packages (first VM)" apt_install_missing setup "${first_vm_packages[@]}" ||
        die "cannot install the packages vm needs"
    exit 0
fi
ci_timed "setup: apt packages (main job)" apt_install_missing setup "${packages[@]}" ||
    die "cannot install the packages vm needs"
# `--packages`: only the packages (what compiling needs: ci/main.sh then builds `vm` while the
# rest of the set-up runs).
[[ ${1:-} != --packages ]] || exit 0

# The guest images (images/build.sh records its kernel and agent steps itself).
ci_timed "setup: images/build.sh (kernel, agent, image set)" images/build.sh || die "images/build.sh failed"

