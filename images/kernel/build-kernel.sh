#!/usr/bin/env bash
# Builds the `vm` guest kernel from Debian's linux-source-6.12.
#
#   images/kernel/build-kernel.sh <out-dir> <work-dir> <log-file>
#
# Called by images/build.sh (which owns caching and atomic publication);
# it can also be run by hand. Steps:
#   1. extract /usr/src/linux-source-6.12.tar.xz into <work-dir>
#   2. apply images/kernel/patches/*.patch with `patch -p1` (fail loudly)
#   3. `make tinyconfig`, merge images/kernel/vm.config, `make olddefconfig`,
#      then check every option of the fragment survived (fail naming the
#      dropped ones)
#   4. `make -j$(nproc) bzImage` (also builds vmlinux), printing a progress
#      line every ~10 s; the full make output goes to <log-file>
#   5. check vmlinux carries the Xen PVH entry note
#   6. write vmlinux, bzImage, config, gen_init_cpio and kernel.info into
#      <out-dir>
#
# Env: VM_KERNEL_OBJECTS_ESTIMATE = object count of a previous build, used to
# print a percentage (images/build.sh passes the last one it saw).
#
# NOTE: images/build.sh hashes this file into the kernel cache key, so any
# edit here rebuilds the kernel.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tarball=/usr/src/linux-source-6.12.tar.xz
fragment=$here/vm.config

say() { echo "kernel: $*" >&2; }
die() { echo "kernel: ERROR: $*" >&2; exit 1; }
fail_with_log() {
    echo "---- last 40 lines of $log ----" >&2
    tail -n 40 "$log" >&2 || true
    echo "----" >&2
    die "$1 (full log: $log)"
}

[[ $# -eq 3 ]] || die "usage: build-kernel.sh <out-dir> <work-dir> <log-file>"
out=$1 work=$2 log=$3
mkdir -p "$out" "$work"
: >"$log"
[[ -f $tarball ]] || die "$tarball missing (apt-get install linux-source-6.12)"

# 1. source
say "extracting $(basename "$tarball")"
tar -xJf "$tarball" -C "$work" >>"$log" 2>&1 || fail_with_log "extracting $tarball failed"
src=$work/linux-source-6.12
[[ -f $src/Makefile ]] || die "unexpected tarball layout: $src/Makefile missing"

# 2. patches
shopt -s nullglob
for p in "$here"/patches/*.patch; do
    say "applying $(basename "$p")"
    patch -p1 --forward --batch -d "$src" <"$p" >>"$log" 2>&1 ||
        fail_with_log "patch $(basename "$p") does not apply to $(basename "$tarball")"
done
shopt -u nullglob

# 3. configuration
kmake() { make -C "$src" KBUILD_BUILD_USER=vm KBUILD_BUILD_HOST=vm "$@"; }
say "configuring: tinyconfig + $(basename "$fragment") + olddefconfig"
{
    kmake tinyconfig &&
        "$src/scripts/kconfig/merge_config.sh" -m -O "$src" "$src/.config" "$fragment" &&
        kmake olddefconfig
} >>"$log" 2>&1 || fail_with_log "kernel configuration failed"

# Every `CONFIG_X=v` of the fragment must be in .config verbatim; every
# `# CONFIG_X is not set` must not be enabled (absent is fine: invisible).
dropped=()
while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
        if ! grep -qxF -- "$line" "$src/.config"; then
            now=$(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" "$src/.config" || echo "absent")
            dropped+=("$line (final .config: $now)")
        fi
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
        if grep -qE "^${BASH_REMATCH[1]}=" "$src/.config"; then
            dropped+=("$line (final .config: $(grep -E "^${BASH_REMATCH[1]}=" "$src/.config"))")
        fi
    fi
done <"$fragment"
if ((${#dropped[@]})); then
    printf 'kernel:   %s\n' "${dropped[@]}" >&2
    die "olddefconfig dropped or changed ${#dropped[@]} option(s) of $fragment (a menu or dependency is off)"
fi
say "config ok: $(grep -c '=y' "$src/.config") options enabled, all of the fragment kept"

# 4. build, with a progress line every ~10 s instead of make's output
jobs=$(nproc)
estimate=${VM_KERNEL_OBJECTS_ESTIMATE:-}
say "make -j$jobs bzImage (log: $log)"
start=$SECONDS
kmake -j"$jobs" bzImage >>"$log" 2>&1 &
make_pid=$!
trap 'kill "$make_pid" 2>/dev/null || true' EXIT
last=$SECONDS
while kill -0 "$make_pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - last >= 10)); then
        last=$SECONDS
        n=$(find "$src" -name '*.o' 2>/dev/null | wc -l) || n=0
        t=$((SECONDS - start))
        if [[ $estimate =~ ^[0-9]+$ ]] && ((estimate > 0)); then
            pct=$((n * 100 / estimate))
            ((pct > 99)) && pct=99
            say "building: $n/$estimate objects (~$pct%), $((t / 60))m$((t % 60))s"
        else
            say "building: $n objects, $((t / 60))m$((t % 60))s"
        fi
    fi
done
if ! wait "$make_pid"; then
    trap - EXIT
    fail_with_log "make bzImage failed"
fi
trap - EXIT
objects=$(find "$src" -name '*.o' | wc -l)
seconds=$((SECONDS - start))
say "built in $((seconds / 60))m$((seconds % 60))s ($objects objects)"

# 5. the PVH entry note (Xen ELF note type 0x12, XEN_ELFNOTE_PHYS32_ENTRY)
notes=$(readelf -n "$src/vmlinux")
grep -qE '^\s*Xen\s+0x[0-9a-f]+\s+(Unknown note type: \(0x00000012\)|.*PHYS32)' <<<"$notes" ||
    die "vmlinux has no Xen PVH (PHYS32_ENTRY) note; is CONFIG_PVH=y?"

# 6. outputs
cp "$src/vmlinux" "$out/vmlinux"
cp "$src/arch/x86/boot/bzImage" "$out/bzImage"
cp "$src/.config" "$out/config"
# The kernel's own initramfs packer: images/verify.sh checks that images/newc.py
# (which packs every initramfs, with or without a compiled kernel) writes the
# same bytes from the same spec.
cc -O2 -o "$out/gen_init_cpio" "$src/usr/gen_init_cpio.c" >>"$log" 2>&1 ||
    fail_with_log "compiling usr/gen_init_cpio.c failed"
{
    echo "release=$(kmake -s kernelrelease)"
    echo "build_seconds=$seconds"
    echo "objects=$objects"
    echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/kernel.info"
cp "$log" "$out/build.log"
