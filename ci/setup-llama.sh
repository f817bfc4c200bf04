#!/usr/bin/env bash
# The llama.cpp model-server test image (images/llama-server.sh), whose static `llama-server`
# (images/llama/build-server.sh, cached by key) is the longest single build of a cold run
# (~11 min of 2 cores). The llama test (cli/tests/llama_server.rs) is in the fast tier.
#
#   ci/setup-llama.sh                 build what is missing, in the foreground
#   ci/setup-llama.sh --start DIR     start the llama-server build in the background and return:
#                                     its own process group (DIR/pgid), at nice 10 so the phases
#                                     beside it keep the cores and it takes what they leave idle
#                                     (the kernel's serial stretches, cargo's last crates and
#                                     links); its log, seconds and exit status go to DIR/log,
#                                     DIR/seconds and DIR/rc (written last)
#   ci/setup-llama.sh --join DIR      wait for that build (at most 45 min), print its log's end
#                                     and fail if it failed, then build the image (seconds)
#   ci/setup-llama.sh --stop DIR      stop a build still running (an EXIT trap's call)
#
# ci/test-all.sh starts it first of all and ci/test.sh joins it before the test tiers; the
# times it records: the build itself, and how long the join waited (the cost to the run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh

say() { echo "setup-llama: $*" >&2; }
die() { echo "setup-llama: ERROR: $*" >&2; exit 1; }

image() {
    local start=$SECONDS
    if images/llama-server.sh --print-path >/dev/null 2>&1; then
        say "llama.cpp server image present: $(images/llama-server.sh --print-path)"
    else
        say "building the llama.cpp server image (images/llama-server.sh)"
        images/llama-server.sh >/dev/null || die "images/llama-server.sh failed"
    fi
    ci_time "setup-tests: images/llama-server.sh (all)" "$start"
}

start() {
    local dir=$1
    mkdir -p "$dir"
    rm -f "$dir/rc" "$dir/seconds" "$dir/pgid"
    if images/llama/build-server.sh --print-path >/dev/null 2>&1; then
        echo 0 >"$dir/rc"
        say "llama-server present: $(images/llama/build-server.sh --print-path)"
        return
    fi
    say "building llama-server in the background at nice 10 (log: $dir/log)"
    # setsid: its pid is its process group's id, so --stop reaches cmake's and make's children.
    # A new session is a new scheduler autogroup (CONFIG_SCHED_AUTOGROUP, on in Debian's
    # kernels), and autogroups share the CPU equally whatever their tasks' nice: the group
    # itself gets nice 10 (/proc/self/autogroup), or the build would take half the cores.
    setsid nice -n 10 bash -c '
        echo 10 >/proc/self/autogroup 2>/dev/null || true
        start=$SECONDS rc=0
        images/llama/build-server.sh >"$1/log" 2>&1 || rc=$?
        echo $((SECONDS - start)) >"$1/seconds"
        echo "$rc" >"$1/rc.tmp" && mv "$1/rc.tmp" "$1/rc"' _ "$dir" </dev/null &
    echo "$!" >"$dir/pgid"
}

join() {
    local dir=$1 start=$SECONDS pgid rc
    [[ -d $dir ]] || die "no background build in $dir (ci/setup-llama.sh --start $dir first)"
    pgid=$(cat "$dir/pgid" 2>/dev/null || true)
    while [[ ! -f $dir/rc ]]; do
        if [[ -n $pgid ]] && ! kill -0 "$pgid" 2>/dev/null && [[ ! -f $dir/rc ]]; then
            die "the background llama-server build (pid $pgid) ended without a status (killed?)"
        fi
        ((SECONDS - start < 45 * 60)) || die "the background llama-server build ran past 45 min"
        sleep 2
    done
    rc=$(cat "$dir/rc")
    if [[ -f $dir/seconds ]]; then
        printf '%s\t%d\t%s\n' "setup: llama/build-server.sh (background, nice 10)" \
            "$(cat "$dir/seconds")" "$( ((rc == 0)) && echo ok || echo "failed (exit $rc)")" \
            >>"${VM_CI_TIMES:-/dev/null}"
    fi
    if ((rc != 0)); then
        tail -n 40 "$dir/log" >&2
        die "images/llama/build-server.sh failed (exit $rc; log: $dir/log)"
    fi
    ci_time "setup-tests: waiting for the llama-server build" "$start"
    image
}

stop() {
    local dir=$1 pgid
    [[ ! -f $dir/rc ]] || return 0
    pgid=$(cat "$dir/pgid" 2>/dev/null) || return 0
    kill -- -"$pgid" 2>/dev/null || true
}

case ${1:-} in
    "") images/llama/build-server.sh >/dev/null || die "images/llama/build-server.sh failed"; image ;;
    --start) start "${2:?--start DIR}" ;;
    --join) join "${2:?--join DIR}" ;;
    --stop) stop "${2:?--stop DIR}" ;;
    *) die "unknown argument $1 (--start DIR, --join DIR, --stop DIR or none)" ;;
esac
