#!/usr/bin/env bash
# Runs all tests from a fresh machine: installs prerequisites (the main job's
# ci/setup.sh, which also builds the guest images, then the test-only
# ci/setup-tests.sh), then runs every test tier. The README's "run all tests".
# Every phase's time goes to one timing file ($VM_CI_TIMES, see ci_time in
# ci/lib.sh), which ci/test.sh prints in its summary with the run's wall time.
#
# The packages go in first, then the longest build, the static llama-server, starts in the
# background (ci/setup-llama.sh --start, at nice 10) and runs beside the kernel, the images,
# the release and test builds and clippy, taking the cores they leave idle; ci/test.sh joins it
# before the test tiers ($VM_CI_LLAMA_DIR). On 2026-12-02 the run waited ~8 min for it idle.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VM_CI_TIMES=$(mktemp "${TMPDIR:-/tmp}/vm-ci-times.XXXXXX")
VM_CI_START=$(date +%s)
VM_CI_LLAMA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/vm-ci-llama.XXXXXX")
export VM_CI_TIMES VM_CI_START VM_CI_LLAMA_DIR
trap 'bash ci/setup-llama.sh --stop "$VM_CI_LLAMA_DIR"; rm -rf "$VM_CI_TIMES" "$VM_CI_LLAMA_DIR"' EXIT
bash ci/setup.sh --packages
bash ci/setup-tests.sh --packages
bash ci/setup-llama.sh --start "$VM_CI_LLAMA_DIR"
bash ci/setup.sh
bash ci/setup-tests.sh
bash ci/test.sh
