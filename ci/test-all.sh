#!/usr/bin/env bash
# Runs all tests from a fresh machine: installs prerequisites, builds the
# guest images, then runs every test tier. The README's "run all tests".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
bash ci/test.sh
