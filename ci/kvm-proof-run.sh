#!/bin/sh
# The kvm proof's runner, copied into a pack as run.sh by `ci/kvm-proof.sh pack`.
#   OUT=/dir ./run.sh [--quick]
# Prints the host facts and `vm drivers`, runs the end-to-end suite on the kvm driver and the
# boot/exec benchmarks, writes $OUT/report.json and $OUT/summary.txt (OUT defaults to ./out).
# Exit: 0 every case passed, 1 a case failed, 2 the pack is broken, 3 this host cannot run kvm.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/out}
export VM_IMAGES_DIR="$here/images"
export VM_TEST_VSOCK_PROBE="$here/bin/vsock-probe" VM_TEST_FS_PROBE="$here/bin/fs-probe"
# The host's own mkfs.erofs wins; the bundled one is the fallback.
export PATH="$PATH:$here/tools/bin"
exec "$here/bin/vm-kvm-proof" --pack "$here" --out "$out" "$@"
