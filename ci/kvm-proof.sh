#!/usr/bin/env bash
# The kvm proof: the end-to-end suite and the boot/exec benchmarks on the kvm driver only, as
# a self-contained pack for a host with hardware virtualization (no Rust toolchain, no network
# needed there).
#
#   ci/kvm-proof.sh pack DIR   build here, into DIR, and DIR.tar.gz beside it (the form that is
#                              carried to another host: at most 60 MiB):
#       run.sh                 the runner (below)
#       bin/vm                 the CLI (release, stripped)
#       bin/vm-vmm, bin/vm-vsock  the kvm driver's VMM; the tcg driver's vsock backend (the
#                              pack's pipeline also runs on tcg where kvm cannot)
#       bin/vm-kvm-proof       the runner's binary (vm_tests::proof)
#       bin/e2e-all            the whole end-to-end suite as one test binary
#       bin/vsock-probe        the attacker scenario's static guest probe (VM_TEST_VSOCK_PROBE)
#       images/current/        the current guest image set (vmlinux, bzImage, initramfs.cpio, ...)
#       tools/                 mkfs.erofs with its libraries (used when the host has none)
#       PACK.txt               what was packed: commit, date, sizes
#   ci/kvm-proof.sh run DIR [OUT]   DIR/run.sh with $OUT (default ./out)
#
# On the target: `OUT=/some/dir DIR/run.sh` prints the host facts, `vm drivers`, runs the
# suite on kvm and the benchmarks, writes OUT/report.json and OUT/summary.txt, and exits
#   0 every case passed, 1 a case failed, 2 the pack is broken, 3 this host cannot run kvm.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "kvm-proof: $*" >&2; }
die() { echo "kvm-proof: ERROR: $*" >&2; exit 2; }
# The archive is what travels (a lent machine takes 64 MiB of files a call); the directory's
# own bound only catches a runaway (a debug binary, an image set twice).
max_archive=$((60 * 1024 * 1024))
max_dir=$((160 * 1024 * 1024))

pack() {
    local dir=$1
    [[ -n $dir ]] || die "usage: ci/kvm-proof.sh pack DIR"
    local images
    images=$("$repo/images/build.sh" --print-dir) || die "no guest images: run images/build.sh"
    cd "$repo"
    say "building the release binaries (vm, vm-vmm, vm-vsock, vm-kvm-proof, the e2e-all suite)"
    cargo build --release --locked -p vm-cli --bin vm -p vmm --bin vm-vmm --bin vm-vsock \
        -p vm-tests --bin vm-kvm-proof >&2
    local json e2e
    json=$(cargo test --release --locked -p vm-tests --test e2e-all --no-run --message-format=json)
    e2e=$(grep -o '"executable":"[^"]*e2e_all-[^"]*"' <<<"$json" | tail -n1 | cut -d'"' -f4)
    [[ -x $e2e ]] || die "cargo did not report the e2e-all test executable"
    local target=${CARGO_TARGET_DIR:-$repo/target}/release
    rm -rf "$dir"
    mkdir -p "$dir/bin" "$dir/images/current" "$dir/tools/bin" "$dir/tools/lib" "$dir/tools/libexec"
    # The kvm driver runs each VM in vm-vmm, found next to the running executable.
    cp "$target/vm" "$target/vm-vmm" "$target/vm-vsock" "$target/vm-kvm-proof" "$dir/bin/"
    cp "$e2e" "$dir/bin/e2e-all"
    strip "$dir/bin/"*
    # The attacker scenario's static guest probe, prebuilt: the target needs no C compiler.
    cc -static -O2 -o "$dir/bin/vsock-probe" "$repo/tests/guest-tools/vsock_probe.c" ||
        die "cc -static tests/guest-tools/vsock_probe.c failed (build-essential)"
    local f
    for f in vmlinux bzImage initramfs.cpio config manifest.json; do
        cp "$images/$f" "$dir/images/current/"
    done
    bundle_mkfs_erofs "$dir/tools"
    cp "$repo/ci/kvm-proof-run.sh" "$dir/run.sh"
    chmod +x "$dir/run.sh"
    {
        echo "vm kvm proof pack"
        echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -r)"
        echo "images: $(basename "$images")"
        (cd "$dir" && find . -type f ! -name PACK.txt -printf '%s %p\n' | sort -k2)
    } >"$dir/PACK.txt"
    local bytes archive=$dir.tar.gz packed
    bytes=$(du -sb "$dir" | cut -f1)
    ((bytes <= max_dir)) || die "the pack is $((bytes / 1048576)) MiB, over its 160 MiB bound"
    tar -C "$(dirname "$dir")" -czf "$archive" "$(basename "$dir")" || die "tar -czf $archive failed"
    packed=$(stat -c %s "$archive")
    ((packed <= max_archive)) ||
        die "$archive is $((packed / 1048576)) MiB, over the 60 MiB limit"
    say "packed $dir: $((bytes / 1048576)) MiB; $archive: $((packed / 1048576)) MiB"
}

# mkfs.erofs (directory mounts become erofs images) with its shared libraries and loader, so
# the pack works on a host without erofs-utils or with another libc.
bundle_mkfs_erofs() {
    local tools=$1 bin lib loader
    bin=$(command -v mkfs.erofs) || die "mkfs.erofs not found (apt-get install erofs-utils)"
    cp "$bin" "$tools/libexec/mkfs.erofs"
    while read -r lib; do
        cp -L "$lib" "$tools/lib/"
    done < <(ldd "$bin" | grep -oE '/[^ ]+\.so[^ ]*')
    loader=$(basename "$(ldd "$bin" | grep -oE '/[^ ]*ld-linux[^ ]*' | head -n1)")
    [[ -e $tools/lib/$loader ]] || die "no dynamic loader found for $bin"
    cat >"$tools/bin/mkfs.erofs" <<WRAP
#!/bin/sh
# mkfs.erofs from the packing host, run with its own libraries and loader.
t=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$t/lib/$loader" --library-path "\$t/lib" "\$t/libexec/mkfs.erofs" "\$@"
WRAP
    chmod +x "$tools/bin/mkfs.erofs"
    "$tools/bin/mkfs.erofs" --help >/dev/null 2>&1 || "$tools/bin/mkfs.erofs" -V >/dev/null ||
        die "the bundled mkfs.erofs does not run"
}

case ${1:-} in
pack) pack "${2:-}" ;;
run)
    [[ -n ${2:-} ]] || die "usage: ci/kvm-proof.sh run DIR [OUT]"
    OUT=${3:-${OUT:-$PWD/out}} exec "$2/run.sh"
    ;;
*) die "usage: ci/kvm-proof.sh pack DIR | run DIR [OUT]" ;;
esac
