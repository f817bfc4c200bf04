#!/usr/bin/env bash
# Checks an image directory built by images/build.sh:
#
#   images/verify.sh [<dir>]     (default: <images dir>/current)
#
# Asserts: all files present; the kernel config has the options guests rely
# on; vmlinux carries the Xen PVH entry note; bzImage is a bzImage; the
# initramfs is an uncompressed newc cpio with /init, busybox and its applets,
# /etc files and /dev/console; /init is a static x86-64 ELF (no NEEDED, no
# INTERP). Prints every failed check, then `verify: FAILED` and exits 1, or
# `verify: ok <dir>`. Needs only bash, coreutils, binutils and cpio.
set -euo pipefail

# shellcheck source=../ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../ci/lib.sh"
dir=${1:-$(vm_images_dir)/current}
[[ -d $dir ]] || { echo "verify: ERROR: $dir is not a directory" >&2; exit 1; }

failures=0
fail() { echo "verify: FAIL: $*" >&2; failures=$((failures + 1)); }

# A set built with `--kernel debian` has no vmlinux; its drivers are modules in the initramfs.
kind=tuned
grep -q '"kind": "debian"' "$dir/manifest.json" 2>/dev/null && kind=debian
files=(bzImage initramfs.cpio config manifest.json)
[[ $kind == debian ]] || files+=(vmlinux)
for f in "${files[@]}"; do
    [[ -s $dir/$f ]] || fail "$dir/$f missing or empty"
done
((failures == 0)) || { echo "verify: FAILED ($failures)" >&2; exit 1; }

# Kernel config facts.
for opt in 64BIT SMP X86_MPPARSE PVH KVM_GUEST PARAVIRT KERNEL_LZ4 SERIAL_8250_CONSOLE EARLY_PRINTK \
    PRINTK_TIME VIRTIO_MMIO VIRTIO_MMIO_CMDLINE_DEVICES VIRTIO_BLK VSOCKETS VIRTIO_VSOCKETS \
    HW_RANDOM_VIRTIO BLK_DEV_INITRD BINFMT_ELF BINFMT_SCRIPT DEVTMPFS TMPFS EROFS_FS EROFS_FS_ZIP EROFS_FS_XATTR EXT4_FS OVERLAY_FS TMPFS_XATTR \
    CGROUPS CGROUP_PIDS MEMCG NET INET UNIX PID_NS SECCOMP SECCOMP_FILTER FUTEX EPOLL UNIX98_PTYS \
    FUSE_FS VIRTIO_FS FUSE_DAX FS_DAX DAX ZONE_DEVICE; do
    if [[ $kind == debian ]]; then
        # Devices found through ACPI, not the command line; CPUs through ACPI's MADT.
        [[ $opt == VIRTIO_MMIO_CMDLINE_DEVICES || $opt == X86_MPPARSE ]] && continue
        grep -qx "CONFIG_$opt=m" "$dir/config" && continue
    fi
    grep -qx "CONFIG_$opt=y" "$dir/config" || fail "config: CONFIG_$opt=y missing"
done
if [[ $kind == debian ]]; then
    for opt in MODULES ACPI; do
        grep -qx "CONFIG_$opt=y" "$dir/config" || fail "config: CONFIG_$opt=y missing"
    done
else
    for opt in MODULES RANDOMIZE_BASE PCI ACPI IPV6; do
        # Disabled either explicitly or by a dependency (then the symbol is absent).
        if grep -qE "^CONFIG_$opt=" "$dir/config"; then fail "config: CONFIG_$opt is enabled"; fi
    done
fi

if [[ $kind == tuned ]]; then
    # PVH entry note: owner Xen, type 0x12 (XEN_ELFNOTE_PHYS32_ENTRY).
    notes=$(readelf -n "$dir/vmlinux" 2>/dev/null) || notes=
    grep -qE '^\s*Xen\s+0x[0-9a-f]+\s+(Unknown note type: \(0x00000012\)|.*PHYS32)' <<<"$notes" ||
        fail "vmlinux: no Xen PVH (PHYS32_ENTRY) ELF note"
    [[ $(head -c 4 "$dir/vmlinux" | od -An -tx1 | tr -d ' ') == 7f454c46 ]] ||
        fail "vmlinux: not an ELF file"
fi
[[ $(dd if="$dir/bzImage" bs=1 skip=514 count=4 2>/dev/null) == HdrS ]] ||
    fail "bzImage: no 'HdrS' boot protocol header"

# Initramfs: uncompressed newc ("070701"), required entries.
[[ $(head -c 6 "$dir/initramfs.cpio") == 070701 ]] ||
    fail "initramfs.cpio: not an uncompressed newc cpio archive"
listing=$(cpio -t --quiet <"$dir/initramfs.cpio" 2>/dev/null) || fail "initramfs.cpio: cpio -t failed"
for entry in init bin/busybox dev/console proc sys tmp mnt etc/passwd etc/group etc/hosts \
    sbin usr/bin bin/sh bin/ls bin/cat bin/echo bin/mount bin/ps bin/sleep bin/uname bin/ip \
    bin/ifconfig bin/wget bin/nc bin/httpd bin/head bin/dd bin/sync bin/grep bin/seq bin/kill \
    bin/mkdir bin/rm bin/true bin/false bin/env bin/id bin/free; do
    grep -qx "$entry" <<<"$listing" || fail "initramfs.cpio: '$entry' missing"
done
# images/newc.py packed it: the kernel's gen_init_cpio (built beside the tuned kernel) must
# write the same bytes from the same spec.
khash=$(sed -n 's/.*"kernel": {"kind": "[a-z]*", "hash": "\([0-9a-f]*\)".*/\1/p' "$dir/manifest.json")
gen=$(dirname "$dir")/kernels/$khash/gen_init_cpio
if [[ $kind == tuned && -x $gen && -f $dir/initramfs.spec ]]; then
    "$gen" -t 0 "$dir/initramfs.spec" | cmp -s - "$dir/initramfs.cpio" ||
        fail "initramfs.cpio: not the bytes gen_init_cpio writes from initramfs.spec"
fi
if [[ $kind == debian ]]; then
    # The agent's module list and every module it names.
    order=$(cpio -i --quiet --to-stdout lib/modules/vm/order <"$dir/initramfs.cpio" 2>/dev/null) ||
        order=
    [[ -n $order ]] || fail "initramfs.cpio: lib/modules/vm/order missing or empty"
    for m in $order; do
        grep -qx "lib/modules/vm/$m" <<<"$listing" || fail "initramfs.cpio: module $m missing"
    done
fi

# /init is a static x86-64 executable.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if (cd "$tmp" && cpio -i --quiet init <"$dir/initramfs.cpio" 2>/dev/null) && [[ -s $tmp/init ]]; then
    hdr=$(readelf -h "$tmp/init" 2>/dev/null) || hdr=
    grep -q 'Machine:.*X86-64' <<<"$hdr" || fail "/init: not an x86-64 ELF"
    grep -qE 'Type:.*(EXEC|DYN)' <<<"$hdr" || fail "/init: not an executable"
    dynamic=$(readelf -d "$tmp/init" 2>/dev/null) || dynamic=
    headers=$(readelf -l "$tmp/init" 2>/dev/null) || headers=
    if grep -q NEEDED <<<"$dynamic"; then fail "/init: dynamically linked (NEEDED entries)"; fi
    if grep -q INTERP <<<"$headers"; then fail "/init: has a program interpreter (INTERP)"; fi
else
    fail "initramfs.cpio: could not extract /init"
fi

if ((failures)); then
    echo "verify: FAILED ($failures)" >&2
    exit 1
fi
echo "verify: ok $dir"
