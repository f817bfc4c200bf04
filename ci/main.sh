#!/usr/bin/env bash
# The main job: the first microVM as soon as one can boot, then the rest of the set-up, then
# the same command again on the tuned kernel (TCG emulation allowed on hosts without usable
# hardware virtualization).
#
#   1. the packages the first VM needs (ci/setup.sh --first-vm-packages: no kernel toolchain);
#   2. the `vm` release build, beside the Debian-kernel image set (images/build.sh --kernel
#      debian: a package download and the static agent, no kernel compile), skipped when a
#      tuned set is already current;
#   3. `vm exec -- uname -a`: the first VM, with the kernel it booted named;
#   4. ci/setup.sh: the kernel toolchain and the tuned kernel (~6 min on 2 cores), which
#      becomes current; then `vm exec -- uname -a` on it.
#
# The release build's output goes to a log, printed if it fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh
start=$SECONDS
bash ci/setup.sh --first-vm-packages
log=$(mktemp "${TMPDIR:-/tmp}/vm-build.XXXXXX.log")
echo "main: building vm (release) alongside the first image set; log: $log" >&2
# `vm-vsock` and `vm-virtiofs` (the tcg driver's vsock backend and file server) are found
# next to `vm`.
cargo build --release -p vm-cli --bin vm -p vmm --bin vm-vsock --bin vm-virtiofs >"$log" 2>&1 &
build=$!
images=$(vm_images_dir)
if [[ ! -f $images/current/vmlinux ]] && ! images/build.sh --kernel debian; then
    kill "$build" 2>/dev/null || true
    wait "$build" 2>/dev/null || true
    exit 1
fi
if ! wait "$build"; then
    tail -n 40 "$log" >&2
    echo "main: ERROR: cargo build --release of vm, vm-vsock and vm-virtiofs failed (log: $log)" >&2
    exit 1
fi
rm -f "$log"
# The binary just built (a `cargo run -p vm-cli` alone could resolve other features and build
# again).
vm=("${CARGO_TARGET_DIR:-$PWD/target}/release/vm")
if [[ ! -f $images/current/vmlinux ]] && "${vm[@]}" drivers | awk '$1 == "kvm" && $2 == "yes" {f = 1} END {exit !f}'; then
    # The kvm driver boots only the tuned kernel (its VMM gives no ACPI): build it first.
    echo "main: kvm is usable here: the first VM waits for the tuned kernel" >&2
    bash ci/setup.sh
fi
"${vm[@]}" exec --allow-emulation -- uname -a
booted=$(sed -n 's/.*"kernel": {"kind": "\([a-z]*\)".*/\1/p' "$images/current/manifest.json")
echo "main: first VM after $((SECONDS - start))s, on the $booted kernel ($(readlink "$images/current"))" >&2
[[ $booted == tuned ]] && exit 0
echo "main: now the tuned kernel (faster boot; the only one the kvm driver boots): ci/setup.sh" >&2
bash ci/setup.sh
"${vm[@]}" exec --allow-emulation -- uname -a
echo "main: done after $((SECONDS - start))s; the tuned kernel is current" >&2
