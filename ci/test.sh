#!/usr/bin/env bash
# Runs every test tier and prints one summary line:
#
#   N passed, N failed, N skipped
#
# Tiers: `cargo build --workspace --all-targets`; rustfmt and clippy (one check
# each); the fast tests
# (`cargo nextest run --workspace`); the slow tier (the #[ignore]d KVM and
# real-kernel tests, `--run-ignored ignored-only`); images/verify.sh on the
# current guest images (one check); the agent's PID-1 test in a TCG guest
# (one check); a 60 s fuzz smoke run per cargo-fuzz
# target when fuzz/ exists (one check each).
#
# passed/failed come from nextest's own summary (or libtest's "test result"
# lines when cargo-nextest is missing), plus the checks above; a tier that
# cannot run at all (build error) counts as one failure. skipped = lines that
# tests appended to $VM_TEST_SKIP_LOG ("SKIP <test>: <reason>"), printed above
# the summary. Exits 1 if anything failed. Expects ci/setup.sh and
# ci/setup-tests.sh to have run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/vm-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT
export VM_TEST_SKIP_LOG=$work/skipped.log
: >"$VM_TEST_SKIP_LOG"

passed=0 failed=0
failures=()
step() { printf '\n==== %s ====\n' "$*" >&2; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "ci: FAILED: $1" >&2; }
sum_matches() { # sum_matches <regex with one number> <file>
    { grep -oE "$1" "$2" || true; } | awk '{s += $1} END {print s + 0}'
}

# run_tests <tier name> <extra args...>: one test tier, counted from its summary.
run_tests() {
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

step "build: cargo build --workspace --all-targets"
cargo build --workspace --all-targets || fail "cargo build --workspace --all-targets"

step "lint: cargo fmt --check, cargo clippy -D warnings"
if cargo fmt --all --check; then passed=$((passed + 1)); else fail "cargo fmt --all --check"; fi
if cargo clippy --workspace --all-targets -- -D warnings; then
    passed=$((passed + 1))
else
    fail "cargo clippy --workspace --all-targets -- -D warnings"
fi

step "tests"
run_tests "tests"

step "slow tier: ignored tests (KVM / real kernel)"
run_tests "slow tier" --run-ignored ignored-only

step "guest images: images/verify.sh"
if dir=$(images/build.sh --print-dir) && images/verify.sh "$dir"; then
    passed=$((passed + 1))
else
    fail "images/verify.sh (run ci/setup.sh or images/build.sh first)"
fi

step "agent PID-1 duties in a real TCG guest: guest-agent/tests/guest/run-tcg.sh"
# The agent's own guest test (mounts, lo, cgroup limits, fork bomb, OOM, cancel, large
# transfers, Forward EOF, Shutdown), run against the static agent the image build produced.
agent_bin=${VM_AGENT_TARGET_DIR:-$(dirname "$dir")/agent-target}/x86_64-unknown-linux-gnu/release/vm-agent
if [[ -n ${dir:-} ]] && guest-agent/tests/guest/run-tcg.sh "$dir/bzImage" "$agent_bin"; then
    passed=$((passed + 1))
else
    fail "guest-agent/tests/guest/run-tcg.sh"
fi

if [[ -d fuzz ]] && ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIP fuzz smoke: no nightly Rust toolchain on this machine (cargo-fuzz needs one)" >>"$VM_TEST_SKIP_LOG"
elif [[ -d fuzz ]]; then
    step "fuzz smoke: 60 s per target"
    fuzz_dir_args=()
    [[ -z ${CARGO_TARGET_DIR:-} ]] || fuzz_dir_args=(--target-dir "$CARGO_TARGET_DIR/fuzz")
    if targets=$(cargo +nightly fuzz list 2>"$work/fuzz-list.err"); then
        for t in $targets; do
            echo "fuzz: $t" >&2
            if timeout 1200 cargo +nightly fuzz run "${fuzz_dir_args[@]}" "$t" -- -max_total_time=60; then
                passed=$((passed + 1))
            else
                fail "fuzz target $t"
            fi
        done
    else
        cat "$work/fuzz-list.err" >&2
        fail "cargo +nightly fuzz list (is cargo-fuzz installed? run ci/setup-tests.sh)"
    fi
fi

skipped=$(wc -l <"$VM_TEST_SKIP_LOG")
echo
if ((skipped)); then cat "$VM_TEST_SKIP_LOG"; fi
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
