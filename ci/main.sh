#!/usr/bin/env bash
# The main job: prepare the machine and images, then run one command in a
# fresh microVM through the CLI (TCG emulation allowed on hosts without
# usable hardware virtualization).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
cargo run --release -p vm-cli --bin vm -- exec --allow-emulation -- uname -a
