#!/usr/bin/env bash
# The kvm road on a host without hardware virtualization: real KVM nested inside QEMU's
# emulated AMD-V. Boots an "L1" Linux (Debian 12's own kernel, with kvm/kvm-amd and
# virtio/9p modules, and ci/kvm-nested-init.sh as its init) under QEMU TCG with an SVM CPU and
# one vCPU, and runs the kvm proof pack (ci/kvm-proof.sh) inside it: `vm drivers`, the whole
# end-to-end suite on the kvm driver (our VMM, vsock device, jail and agent on real kvm_amd,
# the Debian image-root and attacker scenarios included) and the boot/exec benchmarks.
#
#   ci/kvm-nested.sh [--pack DIR] [--out DIR] [--full] [--timeout S] [--stall-after S]
#       --pack DIR   a pack made by `ci/kvm-proof.sh pack` (default: packs one now)
#       --out DIR    where the proof's report.json/summary.txt, the L1's console and log go: an
#                    empty or new directory (one holding anything is refused, so an earlier
#                    run's results are never read as this one's)
#                    (default: a temporary directory, removed on success)
#       --full       the full benchmark plan (20 boots at once, ...) instead of --quick
#       --timeout S  bound on the whole L1 run (default 1800; --full 3600: QEMU 10, the L1's, runs the quick plan in about 800 s)
#       --stall-after S  an L1 whose heartbeat (a file its init rewrites every 5 s) is silent
#                    for S seconds has stalled (default 120): diagnosed, and run once more;
#                    silent for 15 s it is first sent an NMI (a lost timer wake-up: see watch_l1)
#   ci/kvm-nested.sh --self-test-stall [--pack DIR]   the stall path: an L1 that runs one
#                    short scenario (boot), then hangs on purpose (its heartbeat stopped) on
#                    its first attempt only, must be diagnosed (console tail, the vCPU's registers
#                    and LAPIC, an NMI probe) and run once more, which carries that scenario's
#                    cases instead of running it again, runs the CLI's checks on kvm and must
#                    pass (stall after 30 s unless given)
#   ci/kvm-nested.sh --print-l1          build (cached) the L1 and print its directory
#   --cli-only   (debugging the runner) only the L1's CLI checks, not the pack's run.sh
#   --llama      after the CLI checks, the llama.cpp server's warm-start benchmark: cold
#                `vm serve` vs `vm serve --from` a snapshot, start → first completion (needs
#                images/llama-server.sh's image; the lines land in OUT/llama.txt)
#   --weights    after the CLI checks, the weights benchmark (issue 40): a 1 GiB file read whole
#                in each of 4 VMs at once, through the virtio-fs share (DAX) and through the erofs
#                copy: the L1's memory growth and one VM's read time each; `vm exec -- true` with
#                a 16 GiB directory mounted vs none (OUT/weights.txt; the L1 gets 12 GiB)
#   --only NAME  (debugging a scenario) run.sh runs only the e2e tests whose name holds NAME
#   --kernel-arg ARG  (debugging the runner) one more word for the L1 kernel's command line
#   --qemu PATH  another qemu-system-x86_64 for the L1 (default: QEMU 10 from bookworm-backports,
#                images/qemu-l1.sh, in a prefix of its own; its firmware from PREFIX/share/qemu;
#                `--qemu qemu-system-x86_64` is the system's 7.2, which stalls, for comparisons)
#   --smp N      L1 vCPUs (default 1; see below)
#
# Exit: 0 every case passed; 1 a case failed, the L1 failed, stalled three times or the run timed
# out (with the L1's console tail and, when cut off, where its vCPU was, from the QEMU monitor).
# The last line on success: `kvm-nested: N/N cases passed`, after
# `kvm-nested: retried after an L1 stall: ...` when the first attempt stalled.
#
# The L1 (kernel, modules, initramfs) is cached under ~/.cache/vm/kvm-nested/<key>, the key
# hashing this script, the init and the kernel and busybox package versions. Needs
# qemu-system-x86, busybox-static, cpio, python3 (the monitor client), and the Debian root of
# images/rootfs-debian.sh (ci/setup-tests.sh builds it). QEMU 7.2's multi-threaded TCG
# livelocks an L1 running KVM with 2 vCPUs (see ../shared/ENVIRONMENT.md), so the L1 has one.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "kvm-nested: $*" >&2; }
# A run that dies keeps its work directory (console, monitor socket, inputs) for a look.
die() { keep_work=1; echo "kvm-nested: ERROR: $*" >&2; exit 1; }

kernel_pkg=linux-image-amd64
modules=(virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci 9pnet
    9pnet_virtio netfs fscache 9p irqbypass kvm ccp kvm-amd)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/vm/kvm-nested
l1_mem=6G

only= pack= out= full=0 llama=0 timeout= stall_after= mode=run append_extra= qemu= smp=1
while (($#)); do
    case $1 in
    --pack) pack=${2:?--pack DIR}; shift ;;
    --out) out=${2:?--out DIR}; shift ;;
    --full) full=1 ;;
    --timeout) timeout=${2:?--timeout SECONDS}; shift ;;
    --stall-after) stall_after=${2:?--stall-after SECONDS}; shift ;;
    --self-test-stall) mode=stall ;;
    --cli-only) append_extra+=" l1.cli-only=1" ;;
    --llama) append_extra+=" l1.llama=1" llama=1 ;;
    --weights) append_extra+=" l1.weights=1" l1_mem=12G ;;
    --only) only=${2:?--only NAME}; shift ;;
    --kernel-arg) append_extra+=" ${2:?--kernel-arg ARG}"; shift ;;
    --qemu) qemu=${2:?--qemu PATH}; shift ;;
    --smp) smp=${2:?--smp N}; shift ;;
    --print-l1) mode=print ;;
    *) die "unknown argument $1 (see the header of ci/kvm-nested.sh)" ;;
    esac
    shift
done
[[ -z $timeout || $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout: a whole number of seconds, not $timeout"
[[ -z $stall_after || $stall_after =~ ^[1-9][0-9]*$ ]] || die "--stall-after: a whole number of seconds, not $stall_after"

# The kernel package the meta package points at now (e.g. linux-image-6.1.0-57-amd64).
kernel_package() {
    local dep
    local i
    for i in 1 2; do
        dep=$(apt-cache depends "$kernel_pkg" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
        [[ -z $dep && $i == 1 ]] || break
        say "apt-cache knows no $kernel_pkg: apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
    done
    [[ -n $dep ]] || die "apt-cache knows no $kernel_pkg, even after apt-get update"
    echo "$dep"
}

# build_l1: the cached L1 directory (vmlinuz, initrd.cpio, KERNEL) on stdout.
build_l1() {
    local pkg version busybox key dir
    pkg=$(kernel_package)
    version=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
    busybox=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null) ||
        die "busybox-static is not installed"
    key=$(cat "${BASH_SOURCE[0]}" "$repo/ci/kvm-nested-init.sh" <(echo "$pkg $version $busybox") |
        sha256sum | cut -c1-16)
    dir=$cache_root/$key
    if [[ -f $dir/initrd.cpio && -f $dir/vmlinuz ]]; then
        echo "$dir"
        return
    fi
    say "building the L1 ($pkg $version) into $dir"
    local tmp
    tmp=$(mktemp -d "$cache_root.build.XXXXXX")
    (
        set -e
        cd "$tmp"
        apt-get download "$pkg" >/dev/null 2>apt.log || { cat apt.log >&2; exit 1; }
        dpkg-deb -x ./*.deb x
        local kver
        kver=${pkg#linux-image-}
        mkdir -p out initrd/bin initrd/modules initrd/proc initrd/sys initrd/dev initrd/newroot
        cp "x/boot/vmlinuz-$kver" out/vmlinuz
        local m f dep
        for m in "${modules[@]}"; do
            f=$(find "x/lib/modules/$kver" -name "$m.ko" | head -n1)
            [[ -n $f ]] || { echo "module $m.ko is not in $pkg" >&2; exit 1; }
            # Every dependency must be loaded before it: fail here, not in the L1.
            for dep in $(/sbin/modinfo -F depends "$f" | tr ',' ' '); do
                [[ -e initrd/modules/$dep.ko || -e initrd/modules/${dep//_/-}.ko ]] ||
                    { echo "module $m needs $dep, which the list loads later or not at all" >&2; exit 1; }
            done
            cp "$f" initrd/modules/
            echo "$m" >>initrd/modules/order
        done
        cp /bin/busybox initrd/bin/busybox
        ln -s busybox initrd/bin/sh
        cp "$repo/ci/kvm-nested-init.sh" initrd/init
        chmod 755 initrd/init
        (cd initrd && find . | cpio -o -H newc --quiet) >out/initrd.cpio
        echo "$pkg $version" >out/KERNEL
    ) || { rm -rf "$tmp"; die "building the L1 failed"; }
    mkdir -p "$cache_root"
    rm -rf "$dir"
    mv "$tmp/out" "$dir"
    rm -rf "$tmp"
    echo "$dir"
}

# monitor CMD...: each command's answer from the L1's QEMU monitor socket.
monitor() {
    python3 - "$work/monitor.sock" "$@" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
def read_prompt():
    buf = b""
    end = time.time() + 5
    while not buf.endswith(b"(qemu) ") and time.time() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")
read_prompt()
for cmd in sys.argv[2:]:
    s.sendall(cmd.encode() + b"\n")
    print(f"(qemu) {cmd}")
    answer = read_prompt()
    # The monitor echoes the command with line-editing escapes: drop that first line.
    print(answer.split("\n", 1)[-1].replace("(qemu) ", "").strip())
PY
}

# symbol ADDR: the kernel text symbol at or below ADDR (hex), from the L1's kallsyms.
symbol() {
    python3 - "$1" "$out/kallsyms" <<'PY'
import sys
a, best, name = int(sys.argv[1], 16), -1, "?"
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 3 and best < int(f[0], 16) <= a:
        best, name = int(f[0], 16), f[2]
print(f"{name}+{a - best:#x}" if best >= 0 else "?")
PY
}

# diagnose WHY: what the L1 was doing when the run was cut off (sets rip). WHY says why it
# was cut off (a timeout, or a heartbeat that stopped).
rip=
diagnose() {
    say "$1; its console's last 40 lines:"
    tail -n 40 "$work/console.log" >&2 || true
    if [[ -f $out/ps.txt ]]; then
        say "its processes (ps, at most 20 s old):"
        cat "$out/ps.txt" >&2
    fi
    running_test >&2
    say "its vCPU, from the QEMU monitor:"
    local regs
    regs=$(monitor "info status" "info cpus" "info registers" "info lapic" 2>&1) || true
    echo "$regs" >&2
    rip=$(grep -oE 'RIP=[0-9a-f]+' <<<"$regs" | head -n1 | cut -d= -f2) || true
    if [[ -n $rip ]]; then
        say "RIP $rip is $(symbol "$rip" || echo '?') (nokaslr; from its /proc/kallsyms)"
        # A second look a moment later: the same RIP again suggests a livelock, not a slow run.
        sleep 1
        local rip2
        rip2=$(monitor "info registers" 2>&1 | grep -oE 'RIP=[0-9a-f]+' | head -n1 | cut -d= -f2) || true
        local note=
        if grep -q 'HLT=1' <<<"$regs"; then
            note="(the vCPU is halted: the L1 is idle, waiting)"
        elif [[ $(symbol "$rip" 2>/dev/null) == cpu_idle_poll* ]]; then
            note="(the vCPU polls in the idle loop: the L1 is idle, waiting)"
        elif [[ $rip2 == "$rip" ]]; then
            note="(unchanged and not halted: a livelock?)"
        fi
        say "RIP a second later: ${rip2:-?} $note"
        digest+=" RIP ${rip} $(symbol "$rip" 2>/dev/null || echo '?') ${note}"
    fi
}

# running_test: the end-to-end test the L1 was running (the last `test NAME ...` of e2e.log).
running_test() {
    local t
    t=$(grep -oE '^test [^ ]+ \.\.\.' "$out/proof/e2e.log" 2>/dev/null | tail -n1 | cut -d' ' -f2) || true
    echo "kvm-nested: the end-to-end test running then: ${t:-none yet}"
}

# heartbeat_age: seconds since the L1 last wrote $out/heartbeat (since the start before its first).
heartbeat_age() {
    local t=$start
    [[ -f $out/heartbeat ]] && t=$(stat -c %Y "$out/heartbeat")
    ((t >= start)) || t=$start
    echo $(($(date +%s) - t))
}

# nmi_probe: does an NMI bring a stalled L1 back (its heartbeat resumes)? A yes points at a lost
# wake-up (the vCPU halted with no interrupt ever coming), not at a livelock. Diagnosis only:
# the run is cut off either way.
nmi_probe() {
    local before after i
    before=$(cat "$out/heartbeat" 2>/dev/null || echo none)
    monitor "nmi" >/dev/null 2>&1 || true
    for i in 1 2 3 4 5 6 7 8 9 10; do
        sleep 2
        after=$(cat "$out/heartbeat" 2>/dev/null || echo none)
        if [[ $after != "$before" ]]; then
            say "after an NMI the L1's heartbeat resumed (uptime $before -> $after): a lost wake-up"
            digest+=" an NMI woke it (a lost wake-up)."
            return
        fi
    done
    say "after an NMI the L1's heartbeat stayed silent for 20 s"
    digest+=" an NMI did not wake it."
}

l1=$(build_l1)
if [[ $mode == print ]]; then
    echo "$l1"
    exit 0
fi
if [[ -z $qemu ]]; then
    qemu=$("$repo/images/qemu-l1.sh" --print-path) ||
        die "the L1's QEMU 10 is not fetched (images/qemu-l1.sh; ci/setup-tests.sh fetches it)"
fi
command -v "$qemu" >/dev/null || die "$qemu not found (apt-get install qemu-system-x86)"
[[ $smp =~ ^[1-9]$ ]] || die "--smp: 1 to 9 vCPUs, not $smp"
qemu_data=()
prefix=$(dirname "$(dirname "$(command -v "$qemu")")")
[[ $prefix == /usr ]] || qemu_data=(-L "$prefix/share/qemu" -L "$prefix/share/seabios")
command -v python3 >/dev/null || die "python3 not found (the QEMU monitor client)"

work=$(mktemp -d "${TMPDIR:-/tmp}/vm-kvm-nested.XXXXXX")
keep_work=0
cleanup() {
    [[ -z ${qemu_pid:-} ]] || kill -9 "$qemu_pid" 2>/dev/null || true
    ((keep_work)) || rm -rf "$work"
}
trap cleanup EXIT
[[ -n $out ]] || { out=$work/out; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
# A result left by an earlier run must never be read as this run's: a directory that already
# holds anything is refused (nothing in it is touched).
[[ -z $(ls -A "$out") ]] || die "--out $out is not empty (an earlier run's results?): give an empty or new directory"

inputs=$work/inputs
mkdir -p "$inputs"
# The L1 never halts (idle=poll): once (2026-12-01, host load ~10) it sat in native_safe_halt
# with interrupts on and no timer ever waking it again, and a halted TCG vCPU is slow to wake
# anyway: polling, the exec round trip's p50 went from 50.9 to 17.9 ms and a boot from 4.3 to
# 3.8 s, for one host core kept busy while the L1 runs. lapic=notscdeadline: the LAPIC's
# one-shot timer, the older and simpler path than the TSC deadline.
append="console=ttyS0 panic=-1 nokaslr idle=poll lapic=notscdeadline$append_extra"
if [[ $mode == stall ]]; then
    timeout=${timeout:-300} stall_after=${stall_after:-30}
    # Attempt 1 runs one short scenario (no benchmarks), then stops its heartbeat and hangs;
    # attempt 2 must carry that scenario's cases rather than run it again, then run the CLI
    # checks.
    append+=" l1.hang=once"
    only=${only:-boot}
fi
stall_after=${stall_after:-120}
nudge_after=15
if [[ -z $pack ]]; then
    pack=$work/pack
    bash "$repo/ci/kvm-proof.sh" pack "$pack" || die "ci/kvm-proof.sh pack failed"
fi
[[ -x $pack/run.sh ]] || die "$pack is not a kvm proof pack (no run.sh)"
pack=$(cd "$pack" && pwd)
# The image-root scenario's Debian root: an explicit input of the run, never skipped here.
root=$("$repo/images/rootfs-debian.sh" --print-path) ||
    die "the Debian root is not built (images/rootfs-debian.sh; ci/setup-tests.sh builds it)"
ln "$root" "$inputs/debian-root.erofs" 2>/dev/null || cp "$root" "$inputs/debian-root.erofs"
if ((llama)); then
    llama_dir=$(bash "$repo/images/llama-server.sh" --print-path) ||
        die "--llama: the llama.cpp image is not built (images/llama-server.sh)"
    mkdir "$inputs/llama"
    cp -al "$llama_dir/oci" "$llama_dir/models" "$inputs/llama/" 2>/dev/null ||
        cp -a "$llama_dir/oci" "$llama_dir/models" "$inputs/llama/"
fi
if ((full)); then
    timeout=${timeout:-3600}
else
    timeout=${timeout:-1800}
    append+=" l1.proof=--quick"
fi
if [[ -n $only ]]; then
    [[ $only =~ ^[A-Za-z0-9_:]+$ ]] || die "--only: letters, digits, _ and : only, not $only"
    if ((full)); then append+=" l1.proof=--only,$only"; else append+=",--only,$only"; fi
fi
[[ $mode != stall ]] || append+=",--suite-only"

share() { # share TAG DIR [ro]
    local opt=",readonly=on"
    [[ ${3:-} == rw ]] && opt=
    echo "-virtfs" "local,path=$2,mount_tag=$1,security_model=none,id=$1$opt"
}
# boot_l1: starts the L1 in the background (sets qemu_pid, start).
boot_l1() {
    : >"$work/console.log"
    rm -f "$work/monitor.sock"
    start=$(date +%s)
    # shellcheck disable=SC2046 # share prints separate words on purpose
    "$qemu" "${qemu_data[@]}" -accel tcg,thread=multi -cpu max -smp "$smp" -m "$l1_mem" \
        -display none -no-reboot -nic none -nodefaults -no-user-config \
        -serial "file:$work/console.log" \
        -chardev "socket,id=mon,path=$work/monitor.sock,server=on,wait=off" -mon chardev=mon \
        -kernel "$l1/vmlinuz" -initrd "$l1/initrd.cpio" -append "$append" \
        $(share usr /usr) $(share etc /etc) $(share pack "$pack") $(share inputs "$inputs") \
        $(share out "$out" rw) >"$work/qemu.log" 2>&1 &
    qemu_pid=$!
}

# watch_l1: waits for the L1's QEMU to exit (0), its heartbeat to stop for $stall_after s (2:
# a stalled L1), or the bound on the whole run (3). A heartbeat silent for $nudge_after s first
# gets the L1 an NMI (at most one per 10 s): QEMU 7.2's TCG now and then leaves the L1's LAPIC
# timer interrupt pending and undelivered with interrupts on (seen 2026-12-02 in the L1's own
# user space, no L2 running: `IRR 236`, the timer's count 0, `RFLAGS.IF` set), and an NMI makes
# its vCPU look at its interrupts again. A healthy L1 logs an unknown NMI and goes on.
nudges=0
watch_l1() {
    local age nudged=0 now
    while kill -0 "$qemu_pid" 2>/dev/null; do
        now=$(date +%s)
        ((now - start < timeout)) || return 3
        age=$(heartbeat_age)
        ((age < stall_after)) || return 2
        if ((age >= nudge_after && now - nudged >= 10)); then
            monitor "nmi" >/dev/null 2>&1 || true
            nudged=$now nudges=$((nudges + 1))
            say "the L1's heartbeat has been silent for ${age}s: sent it an NMI (nudge $nudges)"
        fi
        sleep 2
    done
    return 0
}

# stop_l1: kills the L1 and keeps its console in $out.
stop_l1() {
    kill -9 "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=
    cp "$work/console.log" "$out/console.log" 2>/dev/null || true
}

# An L1 whose heartbeat stops (its vCPU halted with no wake-up ever coming, seen in about a third
# of the L1 runs of 2026-12-02 under QEMU 7.2's emulated SVM: a fault of the emulation, not of what runs inside) is
# diagnosed, cut off and run again (twice at most), said loudly; a third stall fails the run.
# The next attempt does not run again the end-to-end tests the stalled one finished: the L1's
# init hands their output to the proof (`--carry`), whose cases count as they were. A run that merely goes slow or a test that hangs keeps its heartbeat: the bound on the
# whole run and the suite's own timeouts catch those.
say "L1: $(cat "$l1/KERNEL"), $smp vCPU, $l1_mem, $("$qemu" --version | head -n1); pack $pack; output $out; bound ${timeout}s, stall after ${stall_after}s of silence"
attempt=1 stalls=0 digest=
while :; do
    boot_l1
    why=0
    watch_l1 || why=$?
    took=$(($(date +%s) - start))
    ((why != 0)) || break
    if ((why == 3)); then
        digest+="${digest:+ }the L1 did not finish within ${timeout}s ($(running_test | sed 's/^kvm-nested: //'));"
        diagnose "the L1 did not finish within ${timeout}s"
    else
        digest+="${digest:+ }attempt $attempt: the L1 stalled ($(running_test | sed 's/^kvm-nested: //')); its heartbeat silent for ${stall_after}s after ${took}s;"
        diagnose "the L1's heartbeat has been silent for ${stall_after}s (after ${took}s): it stalled"
        nmi_probe
        say "STALL: $digest"
    fi
    stop_l1
    if [[ $mode == stall ]] && ((attempt == 1)); then
        # The self-test's stalled attempt (the first: it hangs on purpose) must have been
        # diagnosed: the L1 reached its init and the monitor said where the vCPU was. A later
        # attempt that stalls is a real stall, retried as in a normal run.
        grep -q 'hanging on purpose' "$out/console.log" || die "self-test: the L1 never reached its init"
        [[ -n $rip ]] || die "self-test: the monitor gave no vCPU registers"
    fi
    ((why == 3)) && die "the L1 run was cut off after ${took}s: $digest (diagnosis above; console in $out/console.log)"
    stalls=$((stalls + 1))
    ((attempt < 3)) || die "the L1 stalled on all three attempts: $digest"
    # The stalled attempt's files move aside; the next attempt starts from an empty $out.
    kept=$out/stalled-$attempt
    mkdir "$kept"
    find "$out" -mindepth 1 -maxdepth 1 ! -name 'stalled-*' -exec mv {} "$kept/" \;
    say "the stalled attempt's files are in $kept; running the L1 once more"
    attempt=$((attempt + 1))
done
qemu_status=0
wait "$qemu_pid" || qemu_status=$?
qemu_pid=
cp "$work/console.log" "$out/console.log"

if [[ ! -f $out/rc ]]; then
    say "QEMU exited ($qemu_status) after ${took}s with no result from the L1; its console's last 40 lines:"
    tail -n 40 "$out/console.log" >&2
    cat "$work/qemu.log" >&2
    die "the L1 run ended without running the proof"
fi
rc=$(cat "$out/rc")
summary=$out/proof/summary.txt
[[ -f $summary ]] && cat "$summary" >&2
# The proof's cases, the L1's CLI checks (cli.txt: `ok NAME` / `FAIL NAME: why`), and what
# the suite skipped: on this runner every scenario must run, so a skip is a failure.
read -r passed total skipped < <(python3 - "$out/proof/report.json" "$out/cli.txt" <<'PY' || echo "0 0 0"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    r = {}
cases = [c["passed"] for c in r.get("cases", [])]
try:
    cases += [l.startswith("ok ") for l in open(sys.argv[2]) if l.startswith(("ok ", "FAIL "))]
except OSError:
    pass
skipped = [n for n in r.get("notes", []) if n.startswith("skipped:")]
for n in skipped:
    print(n, file=sys.stderr)
print(sum(cases), len(cases), len(skipped))
PY
)
[[ -f $out/cli.txt ]] && cat "$out/cli.txt" >&2
say "the L1 ran for ${took}s; run.sh exited $rc; $passed/$total cases passed; $skipped skipped"
if [[ $rc != 0 ]] || ((total == 0 || passed != total || skipped != 0)); then
    say "the L1's log (the proof's output) ends:"
    tail -n 60 "$out/l1.log" >&2 || true
    [[ -f $out/proof/e2e.log ]] && { say "e2e.log's FAIL lines:"; grep -E 'FAIL|panicked' "$out/proof/e2e.log" | head -n 40 >&2 || true; }
    die "the kvm proof failed inside the L1 (run.sh exit $rc, $passed/$total passed, $skipped skipped${digest:+; earlier: $digest}); output in $out"
fi
((nudges == 0)) || echo "kvm-nested: nudged a silent L1 with an NMI $nudges times"
((stalls == 0)) || echo "kvm-nested: retried after an L1 stall: $digest"
if [[ $mode == stall ]]; then
    # Attempt 1 stalls on purpose. A later stall is the real lost wake-up, retried as in a
    # normal run (CI's run of 2026-12-07 met one on attempt 2, in the L1's boot); it is said,
    # and counted in docs/testing.md, not taken for a fault of the retry path.
    ((stalls >= 1)) || die "self-test: the L1 was meant to stall on its first attempt; it ran through"
    # What attempt 1 finished before it hung is carried, not run again.
    carried=$(grep -c '^  ok   ' "$out/stalled-1/proof/e2e.log" 2>/dev/null || true)
    ((carried > 0)) || die "self-test: the stalled attempt finished no case of $only to carry"
    grep -q '"carried from an attempt an L1 stall cut off' "$out/proof/report.json" ||
        die "self-test: the retry did not carry what the stalled attempt finished"
    grep -q '^running 0 tests' "$out/proof/e2e.log" ||
        die "self-test: the retry ran again what the stalled attempt had finished"
    besides=
    ((stalls == 1)) || besides="; $((stalls - 1)) real stall(s) besides, retried"
    echo "kvm-nested: self-test: a stalled L1 was cut off after ${stall_after}s of silence, diagnosed (RIP $rip) and run once more, its $carried finished cases carried: $passed/$total cases and CLI checks passed$besides"
    exit 0
fi
echo "kvm-nested: $passed/$total cases passed"
