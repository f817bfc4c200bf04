#!/usr/bin/env bash
# The Debian-kernel image set end to end on tcg (what the main job's first VM boots on a fresh
# machine): images/build.sh --kernel debian, then one `vm exec` on that set with a read-only
# mount, which must show Debian's kernel release, the modules PID 1 loaded, module loading
# turned off (an insmod by guest root refused) and the mounted file's bytes.
#
#   bash ci/debian-kernel.sh        (the debug `vm` of the target dir, built when missing; or $VM_BIN)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { echo "debian-kernel: $*" >&2; }
die() { echo "debian-kernel: ERROR: $*" >&2; exit 1; }

built=$(images/build.sh --kernel debian 2>&1) || { echo "$built" >&2; die "images/build.sh --kernel debian failed"; }
echo "$built" >&2
dir=$(sed -n 's/^images \(ready\|up to date\): \(.*\) ([0-9]*s)$/\2/p' <<<"$built" | tail -n1)
[[ -f $dir/manifest.json ]] || die "no image set named in the build's output"
grep -q '"kind": "debian"' "$dir/manifest.json" || die "$dir is not a Debian-kernel set"
release=$(sed -n 's/.*"release": "\([^"]*\)".*/\1/p' "$dir/manifest.json")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/share"
head -c 300000 /dev/urandom >"$work/share/w.bin"
want_sum=$(sha256sum <"$work/share/w.bin" | cut -d' ' -f1)
# The binary the workspace build made (a `cargo run -p vm-cli` alone resolves other features and
# builds again: ~100 s in CI).
vm=${VM_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/debug/vm}
if [[ ! -x $vm || ! -x $(dirname "$vm")/vm-vsock || ! -x $(dirname "$vm")/vm-virtiofs ]]; then
    cargo build --quiet -p vm-cli --bin vm -p vmm --bin vm-vsock --bin vm-virtiofs || die "cargo build of vm failed"
fi
say "vm exec on $dir ($release) with $vm"
out=$("$vm" exec --allow-emulation \
    --kernel "$dir/bzImage" --initrd "$dir/initramfs.cpio" -v "$work/share:/w:ro" -- sh -c '
        echo "release=$(uname -r)"
        echo "disabled=$(cat /proc/sys/kernel/modules_disabled)"
        echo "modules=$(cut -d" " -f1 /proc/modules | sort | tr "\n" ,)"
        echo "sum=$(sha256sum /w/w.bin | cut -d" " -f1)"
        if insmod /lib/modules/vm/fuse.ko 2>/dev/null; then echo insmod=loaded; else echo insmod=refused; fi
    ') || die "vm exec on the Debian kernel failed: $out"
echo "$out" >&2
failures=0
expect() { grep -qx -- "$1" <<<"$out" || { echo "debian-kernel: FAIL: expected '$1'" >&2; failures=$((failures + 1)); }; }
expect "release=$release"
expect "disabled=1"
expect "sum=$want_sum"
expect "insmod=refused"
for m in virtio_mmio virtio_blk vsock vmw_vsock_virtio_transport virtio_rng erofs overlay virtiofs; do
    grep -q "^modules=.*\b$m," <<<"$out" || { echo "debian-kernel: FAIL: module $m not loaded" >&2; failures=$((failures + 1)); }
done
((failures == 0)) || die "$failures check(s) failed"
say "ok: $release booted with its modules, loading off, the mount's bytes intact"
