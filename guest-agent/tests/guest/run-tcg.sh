#!/usr/bin/env bash
# Boot the static vm-agent as PID 1 under QEMU TCG and run tests/guest.rs against it.
#   guest-agent/tests/guest/run-tcg.sh BZIMAGE [VM_AGENT]
# VM_AGENT defaults to the static release build in $CARGO_TARGET_DIR (build it first:
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release -p guest-agent \
#     --bin vm-agent --target x86_64-unknown-linux-gnu).
# Needs qemu-system-x86_64, vm-vsock (built: cargo build -p vmm --bin vm-vsock; taken from
# $target/debug unless VM_VSOCK_BIN names it), busybox (static), cpio, mke2fs.
set -euo pipefail
kernel=${1:?usage: run-tcg.sh BZIMAGE [VM_AGENT]}
target=${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/target}
agent=${2:-$target/x86_64-unknown-linux-gnu/release/vm-agent}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

stage=$work/stage
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,mnt,run}
cp "$agent" "$stage/init"
cp "$(command -v busybox)" "$stage/bin/busybox"
for a in $("$stage/bin/busybox" --list); do [[ $a == busybox ]] || ln -sf busybox "$stage/bin/$a"; done
mknod -m 600 "$stage/dev/console" c 5 1
# The per-boot token, where the drivers' appended archive puts it (the agent unlinks it).
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/agent.token"
install -m 400 "$work/agent.token" "$stage/vm-agent.token"
(cd "$stage" && find . | cpio -o -H newc --quiet) >"$work/initrd.cpio"

mkdir -p "$work/disk"
echo "hello from disk" >"$work/disk/hello.txt"
truncate -s 8M "$work/data.ext4"
mke2fs -q -t ext4 -d "$work/disk" "$work/data.ext4"
head -c 1M /dev/urandom >"$work/raw.img"

vsock_bin=${VM_VSOCK_BIN:-$target/debug/vm-vsock}
"$vsock_bin" --guest-cid 3 --socket "$work/vhu.sock" --uds-path "$work/vm.sock" &
pids+=($!)
for _ in $(seq 50); do [[ -S $work/vhu.sock ]] && break; sleep 0.1; done

qemu-system-x86_64 -machine microvm,acpi=off,memory-backend=mem \
    -object memory-backend-memfd,id=mem,size=512M,share=on -accel tcg -cpu max -m 512 \
    -kernel "$kernel" -initrd "$work/initrd.cpio" \
    -append "console=ttyS0 reboot=t panic=-1 quiet vm.hostname=agent-test vm.pids=64 vm.mem=64 vm.disk=data0:/mnt/data:ext4 vm.disk=raw0:/dev/data-raw:raw" \
    -nodefaults -no-user-config -display none -serial "file:$work/serial.log" -no-reboot \
    -drive id=d0,file="$work/data.ext4",format=raw,if=none,readonly=on -device virtio-blk-device,drive=d0,serial=data0 \
    -drive id=d1,file="$work/raw.img",format=raw,if=none,readonly=on -device virtio-blk-device,drive=d1,serial=raw0 \
    -chardev socket,id=c0,path="$work/vhu.sock" -device vhost-user-vsock-device,chardev=c0 &
qemu=$!
pids+=($qemu)

status=0
# --workspace, not -p guest-agent: the features the workspace build resolved, so the tiers' test
# binary is reused (with -p, cargo compiled ~45 crates again: 84 s of a cold run).
VM_AGENT_GUEST_SOCK=$work/vm.sock VM_AGENT_GUEST_TOKEN=$work/agent.token cargo test --workspace --test guest -- --nocapture || status=$?
for _ in $(seq 100); do kill -0 "$qemu" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$qemu" 2>/dev/null; then
    echo "run-tcg: QEMU still running after Shutdown" >&2
    status=1
else
    echo "run-tcg: QEMU exited after Shutdown"
fi
echo "--- serial log (tail) ---"
tail -n 30 "$work/serial.log"
exit $status
