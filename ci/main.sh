#!/usr/bin/env bash
# The main job: prepare the machine and images, then run one command in a
# fresh microVM through the CLI (TCG emulation allowed on hosts without
# usable hardware virtualization).
#
# Once the packages are in, the `vm` release build runs beside the rest of the
# set-up (the kernel, the guest image): on 2 cores each
# leaves one idle in its serial stretches (the kernel source's extraction, the
# final link), which the other fills. Its output goes to a log, printed if it
# fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh --packages
log=$(mktemp "${TMPDIR:-/tmp}/vm-build.XXXXXX.log")
echo "main: building vm (release) alongside the set-up; log: $log" >&2
# `vm-vsock` and `vm-virtiofs` (the tcg driver's vsock backend and file server) are found
# next to `vm`.
cargo build --release -p vm-cli --bin vm -p vmm --bin vm-vsock --bin vm-virtiofs >"$log" 2>&1 &
build=$!
if ! bash ci/setup.sh; then
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
cargo run --release -p vm-cli --bin vm -- exec --allow-emulation -- uname -a
