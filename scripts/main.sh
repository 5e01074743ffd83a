#!/usr/bin/env bash
# The main job on a fresh Debian machine: install, build, run. Until the RL
# job exists, the main job is the example program on an embedded runtime, an
# actor on an embedded cluster that survives kill -9 of its worker, then a
# local cluster started with the `troupe` command line (a head and two
# node agents), a look at it, and its shutdown.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${BUILD_DIR:-$root/build}"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
"$build/examples/troupe_example_counter"
# An actor on an embedded cluster (troupe::init) surviving kill -9 of its process.
"$build/examples/troupe_example_cluster_counter"
# A data-parallel mesh of 4 processes averaging gradients with an allreduce.
"$build/examples/troupe_example_mesh_allreduce"

# A throwaway cluster home, so that this never touches ~/.troupe.
export TROUPE_HOME
TROUPE_HOME=$(mktemp -d)
troupe="$build/tools/troupe"
trap '"$troupe" stop >/dev/null 2>&1 || true; rm -rf "$TROUPE_HOME"' EXIT
"$troupe" start --head --port 0 --data-dir "$TROUPE_HOME/head"
"$troupe" start --address auto --node-id node-a --cpus 2 --labels rack=r1
"$troupe" start --address auto --node-id node-b --cpus 2 --labels rack=r2
"$troupe" status
"$troupe" stop

# The policy model learning arithmetic in one process (docs/model.md): a
# supervised warm-up on a weak teacher's labels, then GRPO with the exact
# reward beside more supervised training (about 15 seconds on 2 cores).
"$build/examples/troupe_example_rl_arithmetic"
