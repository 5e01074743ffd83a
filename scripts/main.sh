#!/usr/bin/env bash
# The main job on a fresh Debian machine: install, build, run. The examples
# (an actor on an embedded runtime, one on an embedded cluster surviving
# kill -9 of its worker, a data-parallel mesh), a local cluster started with
# the `troupe` command line and its shutdown, then the RL job on meshes.
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

# The main job: RL post-training on actor meshes (docs/rl.md). A trainer
# mesh, a rollout mesh and a reward mesh on an embedded cluster; a small GPT
# learns 2-digit addition with GRPO after a warm-up on a weak teacher's
# labels (held-out accuracy about 50% -> over 90%; under a minute on 2 cores).
run_dir="$root/runs/arithmetic-grpo"
rm -rf "$run_dir"
"$troupe" rl train "$root/examples/rl/arithmetic_grpo.toml" --run-dir "$run_dir"
"$troupe" rl report "$run_dir"
