#!/usr/bin/env bash
# Installs what only the tests need, on top of ci/setup.sh (the main job's
# set-up): e2fsprogs (the agent's PID-1 guest test builds an ext4 disk), python3
# (the sandbox tests serve from it), docker-registry and skopeo (the OCI tests run a
# registry on 127.0.0.1), containerd (1.6, with ctr: the shim's tests start their own in a
# temp dir), mmdebstrap and the Debian python3 + numpy root the image-root
# tests boot (images/rootfs-debian.sh, cached), the rustfmt and clippy components for
# the lint checks, and, when the repository has fuzz targets, a nightly
# toolchain with cargo-fuzz. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh

say() { echo "setup-tests: $*" >&2; }
die() { echo "setup-tests: ERROR: $*" >&2; exit 1; }

apt_install_missing setup-tests e2fsprogs python3 docker-registry skopeo containerd mmdebstrap || die "cannot install the packages the tests need"

# Lints run in ci/test.sh.
for component in clippy rustfmt; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
        say "rustup component add $component"
        rustup component add "$component" || die "rustup component add $component failed"
    fi
done

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

# The Debian python3 + numpy root the image-root tests boot (about 1.5 min when missing; cached).
if ! images/rootfs-debian.sh --print-path >/dev/null; then
    if ((EUID == 0)); then
        images/rootfs-debian.sh >/dev/null || die "images/rootfs-debian.sh failed"
    else
        # Root builds it (mmdebstrap root mode) into this user's cache, where the tests look.
        sudo VM_ROOTFS_DIR="${VM_ROOTFS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/rootfs}" \
            images/rootfs-debian.sh >/dev/null || die "images/rootfs-debian.sh failed"
    fi
else
    say "Debian rootfs present: $(images/rootfs-debian.sh --print-path)"
fi
