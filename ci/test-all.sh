#!/usr/bin/env bash
# Runs all tests from a fresh machine: installs prerequisites (the main job's
# ci/setup.sh, which also builds the guest images, then the test-only
# ci/setup-tests.sh), then runs every test tier. The README's "run all tests".
# Every phase's time goes to one timing file ($VM_CI_TIMES, see ci_time in
# ci/lib.sh), which ci/test.sh prints in its summary with the run's wall time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VM_CI_TIMES=$(mktemp "${TMPDIR:-/tmp}/vm-ci-times.XXXXXX")
VM_CI_START=$(date +%s)
export VM_CI_TIMES VM_CI_START
trap 'rm -f "$VM_CI_TIMES"' EXIT
bash ci/setup.sh
bash ci/setup-tests.sh
bash ci/test.sh
