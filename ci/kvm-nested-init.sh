#!/bin/sh
# The init of the nested-KVM runner's L1 (ci/kvm-nested.sh builds it into the L1's initramfs
# as /init, beside a static busybox and the kvm/virtio/9p modules). Two stages:
#
#   /init           (PID 1 on the initramfs) loads the modules, mounts the host's shares on a
#                   tmpfs and switch_roots into it: the jail's pivot_root is refused on an
#                   initramfs root, so the VMs' jails need a real (tmpfs) root.
#   /.l1/init run   (PID 1 on the tmpfs) mounts /proc, /sys, /dev, /tmp, cgroup2, brings `lo`
#                   up, runs the kvm proof pack and powers off.
#
# The host's directories arrive as 9p shares (mount tags): usr and etc (read-only: the pack's
# binaries are built on the host against its glibc), pack (read-only: ci/kvm-proof.sh's pack),
# inputs (read-only: the Debian root the image-root scenario boots) and out (read-write: the
# proof's report, this init's log and exit code). The proof's arguments come on the kernel
# command line as `l1.proof=ARG,ARG`; an attempt after a stall (the runner moved the stalled
# attempt's files to /out/stalled-N) carries the tests that attempt finished (`--carry`).
# `l1.hang=once` makes stage 2 stop its heartbeat and hang once the proof has run, unless
# /out/stalled-1 exists (the runner's self-test of its stall diagnosis, retry and carry);
# `l1.cli-only=1` runs only the CLI checks.
PATH=/bin:/sbin:/usr/bin:/usr/sbin
export PATH

say() { echo "l1: $*" >/dev/console; }
fatal() {
    say "FATAL: $*"
    [ -d /out ] && echo "l1: FATAL: $*" >>/out/l1.log
    /bin/busybox poweroff -f
}

stage1() {
    /bin/busybox --install -s /bin
    mount -t proc proc /proc
    mount -t sysfs sys /sys
    mount -t devtmpfs dev /dev
    for m in $(cat /modules/order); do
        case $m in
        kvm-amd) insmod "/modules/$m.ko" nested=1 vgif=0 || fatal "insmod $m" ;;
        *) insmod "/modules/$m.ko" || fatal "insmod $m" ;;
        esac
    done
    [ -c /dev/kvm ] || fatal "no /dev/kvm after loading kvm-amd (no SVM in this CPU?)"
    r=/newroot
    mkdir -p $r
    mount -t tmpfs -o mode=0755 root $r || fatal "tmpfs root"
    mkdir -p $r/usr $r/etc $r/pack $r/inputs $r/out $r/proc $r/sys $r/dev $r/tmp $r/run \
        $r/root $r/.l1 $r/var/tmp
    for link in bin sbin lib lib64; do ln -s usr/$link $r/$link; done
    cp /bin/busybox /init $r/.l1/
    # The read-only shares do not change during a run: cache=loose keeps what was read in the
    # L1's page cache, so a binary is fetched over 9p once, not at every exec (as a host's
    # local disk would be); the read-write `out` stays uncached.
    for share in usr etc pack inputs; do
        mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose "$share" \
            "$r/$share" ||
            fatal "mounting the 9p share $share"
    done
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out $r/out || fatal "9p out"
    umount /proc /sys
    exec switch_root $r /.l1/init run
}

stage2() {
    bb=/.l1/busybox
    $bb mount -t proc proc /proc
    $bb mount -t sysfs sys /sys
    $bb mount -t devtmpfs dev /dev
    $bb mkdir -p /dev/pts /dev/shm /sys/fs/cgroup
    $bb mount -t devpts devpts /dev/pts
    $bb mount -t tmpfs -o mode=1777 tmp /tmp
    $bb mount -t tmpfs -o mode=1777 shm /dev/shm
    $bb mount -t tmpfs -o mode=0755 run /run
    $bb mount -t cgroup2 cgroup2 /sys/fs/cgroup
    $bb ip link set lo up || fatal "cannot bring lo up"
    export HOME=/root TMPDIR=/tmp
    log=/out/l1.log
    {
        echo "l1: $($bb uname -r), $($bb nproc) vCPU, $($bb free -m | $bb awk '/Mem:/ {print $2}') MiB"
        echo "l1: kvm_amd nested=$(cat /sys/module/kvm_amd/parameters/nested)" \
            "npt=$(cat /sys/module/kvm_amd/parameters/npt)"
    } | $bb tee -a $log >/dev/console
    # The kernel's text symbols, for the runner's diagnosis of a hang (Debian ships no System.map).
    $bb grep -E ' [tT] ' /proc/kallsyms >/out/kallsyms
    args=$($bb sed -n 's/.*l1\.proof=\([^ ]*\).*/\1/p' /proc/cmdline | $bb tr ',' ' ')
    # What an attempt an L1 stall cut off had finished is not run again: its cases count.
    for carried in /out/stalled-*/proof/e2e.log; do
        [ -f "$carried" ] && args="$args --carry $carried"
    done
    if [ -f /inputs/debian-root.erofs ]; then
        export VM_TEST_DEBIAN_ROOT=/inputs/debian-root.erofs
    fi
    # A heartbeat every 5 s (the L1's uptime; the runner reads the file's age to tell a stalled
    # L1 from a slow test) and what runs, every 20 s (printed if the runner cuts the L1 off).
    (
        n=0
        while :; do
            $bb cut -d' ' -f1 /proc/uptime >/out/heartbeat.tmp && $bb mv /out/heartbeat.tmp /out/heartbeat
            if [ $((n % 4)) = 0 ]; then
                $bb ps -o pid,ppid,stat,rss,args >/out/ps.tmp && $bb mv /out/ps.tmp /out/ps.txt
            fi
            n=$((n + 1))
            $bb sleep 5
        done
    ) &
    heartbeat=$!
    say "running: OUT=/out/proof /pack/run.sh $args"
    rc=0
    if ! $bb grep -q 'l1\.cli-only=1' /proc/cmdline; then
        # shellcheck disable=SC2086 # the arguments are words from the command line
        OUT=/out/proof /pack/run.sh $args >>$log 2>&1 || rc=$?
    fi
    # The runner's self-test: its first attempt stops its heartbeat and hangs here, after the
    # proof; the second (the runner moved the first one's files to /out/stalled-1) goes on.
    if $bb grep -q 'l1\.hang=once' /proc/cmdline && [ ! -d /out/stalled-1 ]; then
        kill "$heartbeat"
        say "hanging on purpose (l1.hang=once)"
        while :; do $bb sleep 3600; done
    fi
    say "run.sh exited $rc; the CLI checks on kvm"
    cli_checks >/out/cli.txt 2>&1
    $bb cat /out/cli.txt >>$log
    if $bb grep -q 'l1\.llama=1' /proc/cmdline; then
        say "the llama.cpp warm-start benchmark"
        llama_warm_start >/out/llama.txt 2>&1
        $bb cat /out/llama.txt >>$log
    fi
    if $bb grep -q 'l1\.weights=1' /proc/cmdline; then
        say "the weights benchmark"
        weights_bench >/out/weights.txt 2>&1
        $bb cat /out/weights.txt >>$log
    fi
    $bb dmesg >/out/dmesg.txt
    echo "$rc" >/out/rc
    $bb sync
    $bb poweroff -f
}

# The CLI on kvm (cli/tests/last_words.rs does the same wherever `cargo test` runs): a root
# the guest cannot mount; `vm exec` and `vm logs --console` of a failed `vm run -d` must show
# the agent's fatal line. One `ok NAME` / `FAIL NAME: why` line per check.
cli_checks() {
    vm=/pack/bin/vm fatal_line="vm-agent: fatal: image root"
    export VM_RUNTIME_DIR=/tmp/cli-rt VM_IMAGES_DIR=/pack/images
    $bb mkdir -p $VM_RUNTIME_DIR
    root=/tmp/broken.erofs
    $bb dd if=/dev/zero of=$root bs=1024 count=1024 2>/dev/null
    # The erofs superblock magic 0xE0F5E1E2 (little-endian) at 1024, and nothing else.
    printf '\342\341\365\340' | $bb dd of=$root bs=1 seek=1024 conv=notrunc 2>/dev/null
    code=0
    $vm exec --rootfs $root -- true </dev/null >/tmp/cli-exec.out 2>&1 || code=$?
    if [ $code = 125 ] && $bb grep -q "$fatal_line" /tmp/cli-exec.out; then
        echo "ok cli/exec_shows_the_agents_last_words"
    else
        echo "FAIL cli/exec_shows_the_agents_last_words: exit $code, $($bb tail -c 600 /tmp/cli-exec.out)"
    fi
    $vm run -d --name broken --rootfs $root </dev/null >/tmp/cli-run.out 2>&1
    $vm logs --console broken </dev/null >/tmp/cli-logs.out 2>&1
    if $bb grep -q "$fatal_line" /tmp/cli-run.out && $bb grep -q "$fatal_line" /tmp/cli-logs.out; then
        echo "ok cli/run_d_and_logs_console_show_the_agents_last_words"
    else
        echo "FAIL cli/run_d_and_logs_console_show_the_agents_last_words: run -d said" \
            "$($bb tail -c 300 /tmp/cli-run.out); logs --console said $($bb tail -c 300 /tmp/cli-logs.out)"
    fi
    $vm rm broken >/dev/null 2>&1
    if $vm drivers 2>&1 | $bb grep -Eq '^kvm +yes'; then
        echo "ok cli/drivers_says_kvm_runs"
    else
        echo "FAIL cli/drivers_says_kvm_runs: $($vm drivers 2>&1 | $bb head -n 3)"
    fi
    snapshot_checks
}

# Snapshots through the CLI on kvm: a snapshot whose warm-up wrote a file, then that file seen
# by `vm exec --from`, by `vm exec NAME` in a `vm run -d --from` VM, and served by busybox
# httpd under `vm serve --from` (the URL it prints answers with the file); the snapshot made
# writable by others refused by `vm exec --from`, naming it.
snapshot_checks() {
    export VM_SNAPSHOTS_DIR=/tmp/cli-snapshots
    if ! $vm snapshot create warm -- sh -c 'echo warm-file >/work/index.html' </dev/null >/tmp/cli-snap.out 2>&1; then
        echo "FAIL cli/snapshot_create: $($bb tail -c 400 /tmp/cli-snap.out)"
        return
    fi
    out=$($vm exec --from warm -- cat /work/index.html </dev/null 2>/tmp/cli-from.err)
    # One restore's timeline (the CLI's debug log: process start, VMM spawned, agent answered,
    # re-keyed, exec), kept in /out for docs/benchmarks.md.
    RUST_LOG=debug $vm exec --from warm -- true </dev/null 2>/out/exec-from-timeline.txt
    if [ "$out" = warm-file ]; then
        echo "ok cli/exec_from_a_snapshot"
    else
        echo "FAIL cli/exec_from_a_snapshot: got '$out'; $($bb tail -c 400 /tmp/cli-from.err)"
    fi
    # A snapshot directory others could write is refused naming it, before anything boots
    # (exit 126), and restores again once it is private.
    $bb chmod 0777 /tmp/cli-snapshots/warm
    # (`open_rc`, not `rc`: the caller's `rc` is run.sh's exit, written to /out/rc after.)
    $vm exec --from warm -- true </dev/null 2>/tmp/cli-open.err
    open_rc=$?
    $bb chmod 0700 /tmp/cli-snapshots/warm
    if [ $open_rc = 126 ] && $bb grep -q "cli-snapshots/warm must belong to uid" /tmp/cli-open.err; then
        echo "ok cli/exec_from_a_snapshot_others_could_write_is_refused"
    else
        echo "FAIL cli/exec_from_a_snapshot_others_could_write_is_refused: exit $open_rc; $($bb tail -c 400 /tmp/cli-open.err)"
    fi
    out=
    if $vm run -d --name warmd --from warm </dev/null >/tmp/cli-rund.out 2>&1; then
        out=$($vm exec warmd -- cat /work/index.html </dev/null 2>>/tmp/cli-rund.out)
    fi
    if [ "$out" = warm-file ]; then
        echo "ok cli/run_d_from_a_snapshot"
    else
        echo "FAIL cli/run_d_from_a_snapshot: got '$out'; $($bb tail -c 400 /tmp/cli-rund.out)"
    fi
    vmm_reports warmd
    $vm rm -f warmd >/dev/null 2>&1
    $vm serve --from warm -p 0:8000 -- httpd -f -p 8000 -h /work </dev/null >/tmp/cli-serve.out 2>/tmp/cli-serve.err &
    serve=$!
    served_page serve_from_a_snapshot warm-file /tmp/cli-serve
    $vm snapshot rm warm >/dev/null 2>&1
    # A snapshot taken serving: httpd started by `snapshot create -p --ready`, running on in
    # the restored VM; `vm serve --from` with no command publishes it.
    if ! $vm snapshot create web -p 8000 --ready /index.html -- \
        sh -c 'echo served-file >/work/index.html; exec httpd -f -p 8000 -h /work' \
        </dev/null >/tmp/cli-snapweb.out 2>&1; then
        echo "FAIL cli/snapshot_create_serving: $($bb tail -c 400 /tmp/cli-snapweb.out)"
        return
    fi
    $vm serve --from web -p 0:8000 </dev/null >/tmp/cli-serveweb.out 2>/tmp/cli-serveweb.err &
    serve=$!
    served_page serve_from_a_serving_snapshot served-file /tmp/cli-serveweb
    $vm snapshot rm web >/dev/null 2>&1
}

# vmm_reports NAME: a running kvm VM has its VMM's device counters in `vm stats --json` (its
# supervisor refreshes them every second: 10 s at most) and its VMM's log in `vm logs --vmm`.
vmm_reports() {
    i=0 stats=
    while [ $i -lt 10 ]; do
        stats=$($vm stats --json "$1" </dev/null 2>&1)
        echo "$stats" | $bb grep -q '"virtio-' && break
        $bb sleep 1
        i=$((i + 1))
    done
    log=$($vm logs --vmm "$1" </dev/null 2>&1) && log_rc=0 || log_rc=$?
    if echo "$stats" | $bb grep -q '"virtio-' && [ $log_rc = 0 ] && [ -n "$log" ]; then
        echo "ok cli/stats_and_logs_vmm_on_kvm"
    else
        echo "FAIL cli/stats_and_logs_vmm_on_kvm: stats said $(echo "$stats" | $bb tail -c 300); logs --vmm exit $log_rc: $(echo "$log" | $bb tail -c 300)"
    fi
}

# wait_url FILE SECONDS: sets url to FILE's first line, the URL the `vm serve` in $serve prints
# once ready; empty if it printed none within SECONDS or exited first.
wait_url() {
    url='' i=0
    while [ $i -lt $(($2 * 10)) ] && [ -z "$url" ] && kill -0 $serve 2>/dev/null; do
        url=$($bb head -n 1 "$1")
        [ -n "$url" ] || $bb usleep 100000
        i=$((i + 1))
    done
}

# served_page NAME CONTENT PREFIX: waits (120 s at most) for the `vm serve` in $serve to print
# its URL in PREFIX.out, fetches /index.html, checks it is CONTENT, then stops the server.
served_page() {
    wait_url "$3.out" 120
    out=
    [ -z "$url" ] || out=$($bb wget -q -O - "$url/index.html" 2>&1)
    if [ "$out" = "$2" ]; then
        echo "ok cli/$1"
    else
        echo "FAIL cli/$1: url '$url', got '$out'; $($bb tail -c 400 "$3.err")"
    fi
    kill -INT $serve 2>/dev/null
    wait $serve 2>/dev/null
}

# The llama.cpp server warm start (ci/kvm-nested.sh --llama shares images/llama-server.sh's
# image and model as /inputs/llama): the time from starting `vm serve` to the first completion
# answered, cold (boot, model load, /health) against `vm serve --from` a snapshot taken once
# /health answered. One `bench llama: ...` line per start, a `FAIL llama: ...` line on error.
llama_warm_start() {
    image=vm.local/llama-server:bench models=/inputs/llama/models
    export VM_OCI_DIR=/tmp/llama-oci
    if ! $vm images import /inputs/llama/oci --name $image </dev/null >/tmp/llama-import.out 2>&1; then
        echo "FAIL llama: import: $($bb tail -c 400 /tmp/llama-import.out)"
        return
    fi
    server="llama-server -m /models/tiny.gguf --host 127.0.0.1 --port 8080 -t 1"
    for round in 1 2; do
        t0=$(uptime_s)
        # shellcheck disable=SC2086 # $server is the server's words
        $vm serve --image $image -v $models:/models:ro -p 0:8080 --ready /health \
            --ready-timeout 600s -- $server </dev/null >/tmp/llama-cold.out 2>/tmp/llama-cold.err &
        serve=$!
        first_completion "cold $round" "$t0" /tmp/llama-cold
    done
    t0=$(uptime_s)
    # shellcheck disable=SC2086
    if ! $vm snapshot create llama --image $image -v $models:/models:ro -p 8080 --ready /health \
        --ready-timeout 600s -- $server </dev/null >/tmp/llama-snap.out 2>&1; then
        echo "FAIL llama: snapshot create: $($bb tail -c 400 /tmp/llama-snap.out)"
        return
    fi
    echo "bench llama: snapshot create (boot, model load, /health, save) $(since "$t0") s"
    for round in 1 2 3; do
        t0=$(uptime_s)
        $vm serve --from llama -p 0:8080 </dev/null >/tmp/llama-warm.out 2>/tmp/llama-warm.err &
        serve=$!
        first_completion "warm $round" "$t0" /tmp/llama-warm
    done
    $vm snapshot rm llama >/dev/null 2>&1
}

# The weights benchmark (ci/kvm-nested.sh --weights; issue 40): a 1 GiB file of random bytes on
# the L1's tmpfs, read whole (`cat` to /dev/null) in each of 4 VMs (`vm run -d`, 1536 MiB each),
# first through the read-only virtio-fs share (DAX: the L1's pages mapped into each guest), then
# through the erofs copy (`:ro,erofs`: each guest's own page cache). Per path: the L1's memory in
# use (MemTotal - MemAvailable) before the VMs start, once they have booted and once the four
# have read, and the first VM's read alone. Then the mount's cost: `vm exec -- true` with a 16 GiB directory (sparse files)
# mounted (with its DAX window, then `--dax-window 0`) vs none, 5 runs each alternating. `bench weights: ...` lines, `FAIL weights: ...` on error.
weights_bench() {
    export VM_RUNTIME_DIR=/tmp/weights-rt
    d=/tmp/weights big=/tmp/weights-16g
    $bb mkdir -p $d $big $VM_RUNTIME_DIR
    $bb head -c 1073741824 /dev/urandom >$d/model.bin
    for i in $($bb seq 1 16); do $bb truncate -s 1G $big/part$i; done
    used_mib() { $bb awk '/^MemTotal/ {t = $2} /^MemAvailable/ {a = $2} END {print int((t - a) / 1024)}' /proc/meminfo; }
    for path in virtiofs erofs; do
        opt=ro
        if [ $path = erofs ]; then
            opt=ro,erofs
            # The erofs image is made once, at the first use: not counted below.
            $vm exec -v $d:/m:$opt -- true </dev/null >/tmp/weights-warm.out 2>&1 ||
                { echo "FAIL weights: erofs image: $($bb tail -c 400 /tmp/weights-warm.out)"; return; }
        fi
        before=$(used_mib)
        for i in 1 2 3 4; do
            if ! $vm run -d --name w$i --memory 1536M -v $d:/m:$opt </dev/null >/tmp/weights-run.out 2>&1; then
                echo "FAIL weights: $path: vm run w$i: $($bb tail -c 400 /tmp/weights-run.out)"
                return
            fi
        done
        booted=$(used_mib)
        # What one booted VM's VMM holds (guest RAM, the window's mapped pages, its own).
        for pid in $($bb pidof vm-vmm); do
            [ "$($bb awk '/^VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null)" -gt 65536 ] 2>/dev/null || continue
            rss=$($bb awk '/^Rss(Anon|File|Shmem)/ {printf "%s %d MiB ", $1, $2 / 1024}' /proc/$pid/status)
            echo "bench weights: $path: a booted VM's VMM: $rss"
        done | $bb head -n 1
        t0=$(uptime_s)
        if ! $vm exec w1 -- sh -c 'cat /m/model.bin >/dev/null' </dev/null >/tmp/weights-read.out 2>&1; then
            echo "FAIL weights: $path: read: $($bb tail -c 400 /tmp/weights-read.out)"
            return
        fi
        alone=$(since "$t0")
        readers=
        for i in 2 3 4; do
            $vm exec w$i -- sh -c 'cat /m/model.bin >/dev/null' </dev/null >/dev/null 2>&1 &
            readers="$readers $!"
        done
        # Only the readers: a bare `wait` would wait for the heartbeat loop too.
        # shellcheck disable=SC2086 # the pids are words
        wait $readers
        after=$(used_mib)
        echo "bench weights: $path: 4 VMs booted: L1 memory in use +$((booted - before)) MiB; one VM reads 1 GiB in $alone s; all 4 having read it: +$((after - booted)) MiB more"
        for i in 1 2 3 4; do $vm rm -f w$i >/dev/null 2>&1; done
    done
    for round in 1 2 3 4 5; do
        t0=$(uptime_s)
        $vm exec -- true </dev/null >/dev/null 2>&1 || echo "FAIL weights: exec with no mount"
        none=$(since "$t0")
        t0=$(uptime_s)
        $vm exec -v $big:/m:ro -- true </dev/null >/dev/null 2>&1 || echo "FAIL weights: exec with 16 GiB"
        mounted=$(since "$t0")
        t0=$(uptime_s)
        $vm exec --dax-window 0 -v $big:/m:ro -- true </dev/null >/dev/null 2>&1 ||
            echo "FAIL weights: exec with 16 GiB, no window"
        echo "bench weights: vm exec -- true, round $round: no mount $none s, 16 GiB directory mounted $mounted s, the same with --dax-window 0 $(since "$t0") s"
    done
}

uptime_s() { $bb cut -d' ' -f1 /proc/uptime; }
since() { echo "$(uptime_s) $1" | $bb awk '{printf "%.2f", $1 - $2}'; }

# first_completion LABEL T0 PREFIX: waits (600 s at most) for the `vm serve` in $serve to print
# its URL in PREFIX.out, asks for a 4-token greedy completion, prints the time since T0 it was
# answered, then stops the server.
first_completion() {
    wait_url "$3.out" 600
    body='{"prompt":"Once upon a time","max_tokens":4,"temperature":0}'
    if [ -n "$url" ] && $bb wget -q -O /tmp/llama-reply --header 'Content-Type: application/json' \
        --post-data "$body" "$url/v1/completions" && $bb grep -q '"completion_tokens":4' /tmp/llama-reply; then
        echo "bench llama: $1: start → first completion $(since "$2") s"
    else
        echo "FAIL llama: $1: url '$url', reply '$($bb head -c 300 /tmp/llama-reply 2>/dev/null)'; $($bb tail -c 400 "$3.err")"
    fi
    kill -INT $serve 2>/dev/null
    wait $serve 2>/dev/null
}

case ${1:-} in
run) stage2 ;;
*) stage1 ;;
esac
fatal "init fell through"
