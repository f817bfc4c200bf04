#!/usr/bin/env bash
# Runs every test tier and every check, and ends with one summary line that counts tests:
#
#   checks: N ok, N failed, N skipped: build ok, fmt ok, clippy ok, ...
#   N flaky (passed on retry, counted in passed): <tests>
#   N passed, N failed, N skipped
#
# Tests: the fast tests (`cargo nextest run --workspace`), the slow tier (the #[ignore]d
# KVM and real-kernel tests, `--run-ignored ignored-only`) and the Python SDK's pytest suite
# (python/tests, against the wheel ci/setup-tests.sh built). Each test counts once, as passed,
# failed or skipped: a test that skipped (its `SKIP <test>: <reason>` line is in
# $VM_TEST_SKIP_LOG) is skipped, not also passed. A test run once per driver (the end-to-end
# scenarios) counts one unit per driver: `boot [tcg]` passed, `boot [kvm]` skipped (its
# `UNITS` record replaces libtest's single result; ci/count-tests.awk does the arithmetic).
# FLAKY tests (failed, then passed on nextest's retry) are counted in passed and listed on
# the line above the summary. A tier that cannot run at all counts as one failed test.
#
# Checks (not tests, their own line): rustfmt, the workspace build linted by clippy (one
# compile: clippy-driver as the workspace's rustc wrapper), images/verify.sh,
# the agent's PID-1 test in a TCG guest (guest-agent/tests/guest/run-tcg.sh), the kvm proof
# (ci/kvm-proof.sh pack; run.sh must answer 0 or 3; its pipeline on tcg), critest (the CRI
# conformance suite, ci/critest.sh run: `critest ok (N passed, N failed, N skipped)`), the same pack on
# real KVM nested in TCG (ci/kvm-nested.sh: every case must pass; `kvm-nested ok (N/N cases
# on kvm)`) after the nested runner's own self-test of its stall diagnosis and retry, and a 60 s
# cargo-fuzz run per target (in the background beside the nested road's one-vCPU L1, one at
# a time, then one per core) from its seed corpus
# (fuzz/seeds/<target>, plus what earlier runs found in the git-ignored fuzz/corpus/<target>);
# without a nightly toolchain the fuzz check is skipped, visibly. A failed check fails the run.
#
# Times (above the checks line): every phase's wall time, one line each — the set-up phases
# ci/setup.sh, ci/setup-tests.sh and images/ recorded in $VM_CI_TIMES (ci/test-all.sh sets it;
# see ci_time in ci/lib.sh), then this script's: each tier, each check, each fuzz target — and
# the whole run's wall time since $VM_CI_START (epoch seconds; ci/test-all.sh sets it, else
# this script's start). A cold run must stay within CI's budget (docs/testing.md).
#
# Exits 1 if any test or check failed. Expects ci/setup.sh and ci/setup-tests.sh to have
# run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source ci/lib.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/vm-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT
export VM_TEST_SKIP_LOG=$work/skipped.log
: >"$VM_TEST_SKIP_LOG"
export VM_CI_TIMES=${VM_CI_TIMES:-$work/times} VM_CI_START=${VM_CI_START:-$(date +%s)}
touch "$VM_CI_TIMES"

passed=0 failed=0 flaky=0
failures=() flaky_tests=() checks=() failed_logs=()
checks_ok=0 checks_failed=0 checks_skipped=0
step() { printf '\n==== %s ====\n' "$*" >&2; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "ci: FAILED: $1" >&2; }
# check <name> <command...>: one check, ok or failed, timed. The command may set
# check_detail (e.g. its case counts) to show beside its "ok".
# Its output also goes to a log, whose last lines the summary repeats if it fails.
check() {
    local name=$1 rc=0 log
    shift
    check_detail=
    log=$work/check-$((${#checks[@]} + 1)).log
    { ci_timed "check: $name" "$@" || rc=$?; } > >(tee "$log" >&2) 2>&1
    wait "$!" 2>/dev/null || true # the tee (no check starts jobs of its own in this shell)
    record_check "$name" "$rc" "$log"
}
# record_check <name> <exit status> [<log>]: count one check's result.
record_check() {
    local name=$1
    (($2 == 0)) || [[ -z ${3:-} ]] || failed_logs+=("$name"$'\t'"$3")
    if (($2 == 0)); then
        checks+=("$name ok${check_detail:+ ($check_detail)}")
        checks_ok=$((checks_ok + 1))
    else
        checks+=("$name FAILED")
        checks_failed=$((checks_failed + 1))
        failures+=("check $name")
        echo "ci: FAILED: check $name" >&2
    fi
    check_detail=
}
check_skipped() { # check_skipped <name> <reason>
    checks+=("$1 skipped ($2)")
    checks_skipped=$((checks_skipped + 1))
}
sum_matches() { # sum_matches <regex with one number> <file>
    { grep -oE "$1" "$2" || true; } | awk '{s += $1} END {print s + 0}'
}

# run_tests <tier name> <extra args...>: one test tier, counted from its summary, timed.
run_tests() {
    ci_timed "tier: $1" run_tier "$@" || true # a tier's failures are counted, not returned
}
run_tier() {
    local name=$1 out=$work/tier.log status=0 p f
    shift
    if command -v cargo-nextest >/dev/null; then
        cargo nextest run --workspace --no-fail-fast --no-tests=pass "$@" 2>&1 | tee "$out" || status=$?
        local summary
        summary=$(grep -E '^ *Summary \[' "$out" | tail -n1 || true)
        if [[ -z $summary ]]; then
            fail "$name: nextest did not complete (exit $status)"
            return
        fi
        p=$(sum_matches '[0-9]+ passed' <(echo "$summary"))
        f=$(($(sum_matches '[0-9]+ failed' <(echo "$summary")) + $(sum_matches '[0-9]+ timed out' <(echo "$summary"))))
        flaky=$((flaky + $(sum_matches '[0-9]+ flaky' <(echo "$summary"))))
        # nextest's final status lines: "FLAKY 2/2 [   1.234s] crate::binary test".
        while read -r t; do flaky_tests+=("$t"); done < <(
            sed -nE 's/^ *FLAKY [0-9]+\/[0-9]+ \[[^]]*\] +(\([^)]*\) +)?//p' "$out" | sort -u)
    else
        local args=()
        [[ ${1:-} == --run-ignored ]] && args=(-- --ignored)
        cargo test --workspace --no-fail-fast "${args[@]}" 2>&1 | tee "$out" || status=$?
        if ! grep -q '^test result:' "$out"; then
            fail "$name: cargo test did not complete (exit $status)"
            return
        fi
        p=$(sum_matches '[0-9]+ passed;' "$out")
        f=$(sum_matches '[0-9]+ failed;' "$out")
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    ((f == 0)) || failures+=("$name: $f test(s)")
    if ((f == 0 && status != 0)); then fail "$name: runner exited $status with no failed test"; fi
}

step "lint: cargo fmt --check"
check fmt cargo fmt --all --check

# One compile for the build and clippy: clippy-driver as the workspace's rustc wrapper (what
# `cargo clippy` sets up, RUSTC_WORKSPACE_WRAPPER and CLIPPY_ARGS) lints every workspace
# target while it compiles it, so `cargo build --all-targets` fails on any clippy warning as
# `cargo clippy --all-targets -- -D warnings` does, without a second pass over the workspace
# and its dependencies (268 s of a cold run on 2026-12-02). The wrapper is part of each
# workspace crate's fingerprint: the test tiers and the agent's guest test build with it too
# (nothing is compiled again); the release builds (the kvm pack, which reuses the SDK wheel's)
# and the fuzz targets build without it.
clippy_driver=$(dirname "$(rustup which cargo 2>/dev/null || command -v cargo)")/clippy-driver
if [[ -x $clippy_driver ]]; then
    export RUSTC_WORKSPACE_WRAPPER=$clippy_driver CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    step "build + clippy: cargo build --workspace --all-targets, linted by clippy-driver (-D warnings)"
    check "build+clippy" cargo build --workspace --all-targets
else
    step "build: cargo build --workspace --all-targets; clippy: cargo clippy -D warnings"
    check build cargo build --workspace --all-targets
    check clippy cargo clippy --workspace --all-targets -- -D warnings
fi
no_lint() { env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS "$@"; }

# The llama.cpp server image (the fast tier's llama test boots it): under ci/test-all.sh its
# llama-server build has run in the background since the start; wait for it here. Its failure
# ends the run (a set-up failure, not a test's).
if [[ -n ${VM_CI_LLAMA_DIR:-} ]]; then
    step "set-up: joining the background llama-server build (ci/setup-llama.sh --join)"
    bash ci/setup-llama.sh --join "$VM_CI_LLAMA_DIR" || { echo "ci: ERROR: the llama.cpp server image failed" >&2; exit 1; }
fi

step "tests"
run_tests "tests"

step "slow tier: ignored tests (KVM / real kernel)"
run_tests "slow tier" --run-ignored ignored-only

# run_pytest: the Python SDK's suite (python/tests) against the vm_sandbox wheel
# ci/setup-tests.sh installed in its venv, counted from pytest's closing line ("N passed, N
# failed, N skipped in Xs"). Its conftest writes a SKIP line per skipped test to
# $VM_TEST_SKIP_LOG, which count-tests.awk takes off `passed`, so skips are added to it here
# first. A no-driver host fails the suite (test-support's rule, in python/tests/conftest.py).
run_pytest() {
    local name="python sdk" out=$work/pytest.log status=0 summary p f s
    local venv=${VM_SDK_VENV:-$HOME/.cache/vm/venv-sdk}
    if [[ ! -x $venv/bin/pytest ]]; then
        fail "$name: no $venv/bin/pytest (run ci/setup-tests.sh)"
        return
    fi
    # The pytest script (not `python -m`): the installed wheel is imported, never the source.
    "$venv/bin/pytest" -p no:cacheprovider -rs python/tests 2>&1 | tee "$out" || status=$?
    summary=$(grep -E '^=+ .*[0-9]+ (passed|failed|errors?|skipped).* in [0-9.]+s' "$out" | tail -n1 || true)
    if [[ -z $summary ]]; then
        fail "$name: pytest did not complete (exit $status)"
        return
    fi
    p=$(sum_matches '[0-9]+ passed' <(echo "$summary"))
    f=$(($(sum_matches '[0-9]+ failed' <(echo "$summary")) + $(sum_matches '[0-9]+ errors?' <(echo "$summary"))))
    s=$(sum_matches '[0-9]+ skipped' <(echo "$summary"))
    passed=$((passed + p + s))
    failed=$((failed + f))
    ((f == 0)) || failures+=("$name: $f test(s)")
    if ((f == 0 && status != 0)); then fail "$name: pytest exited $status with no failed test"; fi
}

step "python sdk: pytest python/tests (the vm_sandbox wheel against real guests)"
ci_timed "tier: python sdk" run_pytest || true

step "guest images: images/verify.sh"
dir=$(images/build.sh --print-dir) || dir=
verify_images() { [[ -n $dir ]] && images/verify.sh "$dir"; }
check images/verify.sh verify_images

step "Debian's kernel: ci/debian-kernel.sh (the main job's first VM on a fresh machine)"
# The image set ci/main.sh boots before the tuned kernel is built: built (a package download
# and the cached agent, built without the lint wrapper as the set-up built it), then one tcg
# guest on it with a mount, its modules and loading off.
check debian-kernel no_lint bash ci/debian-kernel.sh

step "agent PID-1 duties in a real TCG guest: guest-agent/tests/guest/run-tcg.sh"
# The agent's own guest test (mounts, lo, cgroup limits, fork bomb, OOM, cancel, large
# transfers, Forward EOF, Shutdown), run against the static agent the image build produced.
agent_guest() {
    [[ -n $dir ]] || return 1
    local agent_bin=${VM_AGENT_TARGET_DIR:-$(dirname "$dir")/agent-target}/x86_64-unknown-linux-gnu/release/vm-agent
    guest-agent/tests/guest/run-tcg.sh "$dir/bzImage" "$agent_bin"
}
check agent-guest agent_guest

step "kvm proof: ci/kvm-proof.sh pack, run.sh here, and the same pipeline on tcg"
# The pack must build and stay under its size limit; run.sh must answer 0 (kvm proven) or 3
# (this host cannot run kvm, with its facts) — never 1 or 2; and the runner's suite and
# benchmark paths run end to end on tcg (--quick), so they never rot on hosts without kvm.
# There the suite runs one scenario (--only boot): every scenario already runs on tcg in the
# fast tier and, from this same pack, on kvm in the nested road; what this run proves is the
# runner (the suite binary started and its results read, the benchmarks, the report), and
# the whole suite again here cost ~2 min of a cold run.
kvm_pack=$work/kvm-proof
kvm_proof() {
    local code=0
    no_lint bash ci/kvm-proof.sh pack "$kvm_pack" || return 1
    OUT=$work/kvm-proof-out "$kvm_pack/run.sh" || code=$?
    echo "kvm proof: run.sh exited $code" >&2
    [[ $code == 0 || $code == 3 ]] || return 1
    OUT=$work/kvm-proof-tcg "$kvm_pack/run.sh" --quick --driver tcg --only boot || return 1
}
check kvm-proof kvm_proof

step "critest: Kubernetes' CRI conformance suite against the shim (ci/critest.sh run)"
# critest v1.32.0 (built by ci/setup-tests.sh from ../shared/critest) on cri.rs's node: it fails
# on any spec failing outside shim/tests/critest.rs's commented list of refusals by design; the
# totals line ("critest: N passed, N failed, N skipped") is shown beside its "ok".
critest_run() {
    local log=$work/critest.log rc=0
    bash ci/critest.sh run 2>&1 | tee "$log" >&2 || rc=$?
    check_detail=$(grep -o 'critest: [0-9]* passed, [0-9]* failed, [0-9]* skipped' "$log" | tail -1)
    check_detail=${check_detail#critest: }
    return "$rc"
}
check critest critest_run

# The fuzz smoke: a 60 s cargo-fuzz run per target from its seeds, started in the background
# beside the nested kvm road. The nested L1 has one vCPU (ci/kvm-nested.sh says why), so for
# its ~7 min one core is idle: the fuzz build and one target at a time run there (nice 10, the
# L1 keeps its core), then, once the nested road is done, one target per core. libFuzzer runs
# one process on one core and 60 s is wall time, so each target gets the same executions
# either way. Each target's log is apart, printed and counted in order by fuzz_finish.
# fuzz_target <target>: a 60 s run from the in-repo seeds (read only) plus the corpus earlier
# runs grew (fuzz/corpus/<target>, git-ignored, where libFuzzer writes what it finds).
fuzz_dir_args=()
[[ -z ${CARGO_TARGET_DIR:-} ]] || fuzz_dir_args=(--target-dir "$CARGO_TARGET_DIR/fuzz")
fuzz_target() {
    local t=$1
    [[ -d fuzz/seeds/$t ]] || { echo "ci: no seed corpus fuzz/seeds/$t" >&2; return 1; }
    mkdir -p "fuzz/corpus/$t"
    timeout 1200 cargo +nightly fuzz run "${fuzz_dir_args[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" \
        -- -max_total_time=60
}
fuzz_state=none fuzz_pid= fuzz_targets= fuzz_wide=$work/fuzz-wide
# fuzz_limit: how many targets may run at once now (1 until fuzz_finish creates $fuzz_wide).
fuzz_limit() { if [[ -e $fuzz_wide ]]; then echo "${VM_CI_FUZZ_JOBS:-$(nproc)}"; else echo 1; fi; }
fuzz_start() {
    [[ -d fuzz ]] || return 0
    if ! cargo +nightly --version >/dev/null 2>&1; then fuzz_state=skipped; return 0; fi
    if ! fuzz_targets=$(cargo +nightly fuzz list 2>"$work/fuzz-list.err"); then
        fuzz_state=unlisted
        return 0
    fi
    step "fuzz smoke starts in the background: built, then 60 s per target (logs in $work)"
    fuzz_state=started
    (
        renice -n 10 -p "$BASHPID" >/dev/null
        unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
        ci_timed "fuzz: build every target (beside the nested road)" \
            cargo +nightly fuzz build "${fuzz_dir_args[@]}" >"$work/fuzz-build.log" 2>&1 ||
            echo "ci: cargo fuzz build failed; each target's check will say why" >>"$work/fuzz-build.log"
        for t in $fuzz_targets; do
            while (($(jobs -rp | wc -l) >= $(fuzz_limit))); do sleep 2; done
            (
                rc=0
                ci_timed "check: fuzz $t" fuzz_target "$t" >"$work/fuzz-$t.log" 2>&1 || rc=$?
                echo "$rc" >"$work/fuzz-$t.rc"
            ) &
        done
        wait
    ) </dev/null &
    fuzz_pid=$!
}
fuzz_finish() {
    case $fuzz_state in
        none) return 0 ;;
        skipped) check_skipped fuzz "no nightly Rust toolchain on this machine; cargo-fuzz needs one"; return 0 ;;
        unlisted)
            cat "$work/fuzz-list.err" >&2
            check "cargo +nightly fuzz list (is cargo-fuzz installed? run ci/setup-tests.sh)" false
            return 0 ;;
    esac
    step "fuzz smoke: the rest, one target per core"
    touch "$fuzz_wide"
    wait "$fuzz_pid" || true
    tail -n 5 "$work/fuzz-build.log" >&2
    local t rc
    for t in $fuzz_targets; do
        rc=$(cat "$work/fuzz-$t.rc" 2>/dev/null || echo 1)
        echo "---- fuzz $t (exit $rc) ----" >&2
        if ((rc == 0)); then tail -n 20 "$work/fuzz-$t.log" >&2; else cat "$work/fuzz-$t.log" >&2; fi
        record_check "fuzz $t" "$rc" "$work/fuzz-$t.log"
    done
}

step "the kvm road on real KVM nested in TCG: ci/kvm-nested.sh"
# The same pack, run inside an L1 Linux that runs Debian's kvm_amd under QEMU's emulated
# AMD-V: the whole end-to-end suite on the kvm driver, and the CLI's checks on kvm. First the
# runner's own stall path: an L1 that stops on purpose must be diagnosed and run once more.
kvm_nested_stall() {
    [[ -x $kvm_pack/run.sh ]] || { echo "ci: no kvm proof pack (the kvm-proof check failed)" >&2; return 1; }
    bash ci/kvm-nested.sh --self-test-stall --pack "$kvm_pack"
}
fuzz_start
check kvm-nested-stall-retry kvm_nested_stall
kvm_nested() {
    local result
    [[ -x $kvm_pack/run.sh ]] || { echo "ci: no kvm proof pack (the kvm-proof check failed)" >&2; return 1; }
    bash ci/kvm-nested.sh --pack "$kvm_pack" --out "$work/kvm-nested" | tee "$work/kvm-nested.result" || {
        cp -r "$work/kvm-nested" "${TMPDIR:-/tmp}/vm-kvm-nested-failed.$$" 2>/dev/null &&
            echo "ci: the L1's files are kept in ${TMPDIR:-/tmp}/vm-kvm-nested-failed.$$" >&2
        return 1
    }
    result=$(sed -n 's/^kvm-nested: \([0-9]*\/[0-9]*\) cases passed$/\1/p' "$work/kvm-nested.result")
    [[ -n $result ]] || return 1
    check_detail="$result cases on kvm"
    ! grep -q '^kvm-nested: retried after an L1 stall' "$work/kvm-nested.result" ||
        check_detail+=", after one L1 stall (see its log)"
    local nudged
    nudged=$(sed -n 's/^kvm-nested: nudged a silent L1 with an NMI \([0-9]*\) times$/\1/p' "$work/kvm-nested.result")
    [[ -z $nudged ]] || check_detail+=", the L1 nudged by an NMI $nudged times"
}
check kvm-nested kvm_nested
rm -rf "$kvm_pack"

fuzz_finish

counts=$(awk -v passed="$passed" -v failed="$failed" -f ci/count-tests.awk "$VM_TEST_SKIP_LOG")
read -r _ passed failed skipped < <(grep '^COUNTS ' <<<"$counts")
echo
# The skips, one line per driver and reason (the tests named below it), so that the failures
# and the summary stay in view at the end of a long log.
grep -v '^COUNTS ' <<<"$counts" | awk '
    match($0, /^SKIP [^ :]+ \[[^]]+\]: /) {
        head = substr($0, 6, RLENGTH - 7); reason = substr($0, RLENGTH + 1)
        unit = head; sub(/^[^ ]+ /, "", unit); name = head; sub(/ .*$/, "", name)
        key = unit ": " reason
        if (!(key in tests)) order[++n] = key
        tests[key] = tests[key] (tests[key] == "" ? "" : ", ") name; count[key]++
        next
    }
    { print }
    END { for (i = 1; i <= n; i++) printf "SKIP %d x %s\n    %s\n", count[order[i]], order[i], tests[order[i]] }
' || true
for f in "${failures[@]}"; do echo "FAILED: $f"; done
# print_times: each recorded phase, then the whole run's wall time against the budget of a
# cold run ($VM_CI_BUDGET_MIN, 60 min; CI itself cuts a run off at 90): said, not enforced.
print_times() {
    local phase secs status total=$(($(date +%s) - VM_CI_START)) budget=${VM_CI_BUDGET_MIN:-60}
    echo "times (wall, one line per phase):"
    while IFS=$'\t' read -r phase secs status; do
        printf '  %-62s %6d s  %s\n' "$phase" "$secs" "$status"
    done <"$VM_CI_TIMES"
    printf '  %-62s %6d s  (%d min %02d s; budget %d min%s)\n' "total wall time" "$total" \
        $((total / 60)) $((total % 60)) "$budget" "$( ((total <= budget * 60)) || echo ', OVER')"
}
print_times
# why_failed: each failed check's last lines of output (its full output is above).
why_failed() {
    local entry name log
    for entry in "${failed_logs[@]}"; do
        name=${entry%%$'\t'*} log=${entry#*$'\t'}
        echo "why check $name failed (the end of its output):"
        grep -v '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 12 | cut -c1-600 | sed 's/^/  | /'
    done
}
why_failed
(IFS=,; echo "checks: $checks_ok ok, $checks_failed failed, $checks_skipped skipped: ${checks[*]/#/ }" | sed 's/:  /: /')
echo "$flaky flaky (passed on retry, counted in passed)${flaky_tests[*]:+: ${flaky_tests[*]}}"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0 && checks_failed == 0))
