#!/usr/bin/env bash
# Runs all tests from a fresh machine: installs prerequisites (the main job's
# ci/setup.sh, which also builds the guest images, then the test-only
# ci/setup-tests.sh), then runs every test tier. The README's "run all tests".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
bash ci/setup-tests.sh
bash ci/test.sh
