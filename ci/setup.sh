#!/usr/bin/env bash
# Installs what building and testing `vm` needs on a Debian 12 x86_64 machine,
# then builds the guest images. Idempotent and quick when all is present:
# apt-get runs (after `apt-get update`) only for missing packages, cargo
# installs only what is missing or at the wrong version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "setup: $*" >&2; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

packages=(qemu-system-x86 busybox-static erofs-utils e2fsprogs cpio lz4 linux-source-6.12 bc flex
    bison libelf-dev libssl-dev file build-essential patch binutils docker-registry skopeo python3)
vhost_vsock_version=0.3.0

command -v dpkg-query >/dev/null || die "not a Debian machine (dpkg-query missing)"
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (stable, plus nightly for fuzzing)"

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=()
    ((EUID == 0)) || sudo=(sudo)
    say "apt-get install ${missing[*]}"
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
    # Some packages (docker-registry) start a service when installed; the tests start their
    # own on a free port, so installs run under a policy-rc.d that refuses (exit 101).
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        own_policy=1
    fi
    rc=0
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" || rc=$?
    ((own_policy)) && "${sudo[@]}" rm -f "$policy"
    ((rc == 0)) || die "apt-get install ${missing[*]} failed"
else
    say "apt packages present"
fi

# Lints run in ci/test.sh.
for component in clippy rustfmt; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
        say "rustup component add $component"
        rustup component add "$component" || die "rustup component add $component failed"
    fi
done

# vhost-user vsock backend for the QEMU (TCG) driver.
if [[ $(vhost-device-vsock --version 2>/dev/null || true) != "vhost-device-vsock $vhost_vsock_version" ]]; then
    say "cargo install vhost-device-vsock $vhost_vsock_version (a few minutes)"
    cargo install vhost-device-vsock --version "$vhost_vsock_version" --locked ||
        die "cargo install vhost-device-vsock failed"
else
    say "vhost-device-vsock $vhost_vsock_version present"
fi

# Fuzzing (only when the repository has fuzz targets): nightly + cargo-fuzz.
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

command -v cargo-nextest >/dev/null || say "note: cargo-nextest not installed; ci/test.sh falls back to cargo test"

images/build.sh || die "images/build.sh failed"
