#!/usr/bin/env bash
# The main job on a fresh Debian machine: install, build, run. Until the RL
# job exists, the main job is the example program on an embedded runtime.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
"${BUILD_DIR:-$root/build}/examples/troupe_example_counter"
