#!/usr/bin/env bash
# The checks that need a GPU, for a session lent a GPU machine (the device
# tool: see the developers' guide). The GPU machine has no package registry,
# so everything is built here and carried there:
#
#   here:   bash scripts/gpu.sh bundle     builds, and bundles into .gpu/ (git-ignored: carry it)
#   there:  bash scripts/gpu.sh tests      the [gpu] suite             -> $OUT/gpu_tests.log
#           bash scripts/gpu.sh bench      the GPU benchmarks (JSON)   -> $OUT/bench_*.jsonl
#
# Worker processes are the bundled test or benchmark executable itself, so
# they get the bundle's libraries too; the trainer's CUDA model
# (libtroupe_rl_cuda, loaded at run time) is copied into the bundle's lib/.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
progs=(build/test/troupe_gpu_tests build/bench/troupe_bench_model_gpu build/bench/troupe_bench_generate_gpu
       build/bench/troupe_bench_rl_job)

case "${1:-}" in
  bundle)
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
    ninja -C build
    [[ -x build/bench/troupe_bench_nccl ]] && progs+=(build/bench/troupe_bench_nccl)
    rm -rf .gpu
    ../shared/tools/bundle .gpu "${progs[@]}"
    cp -fL build/rl/libtroupe_rl_cuda.so.0 .gpu/lib/
    # Debug sections are most of the size, and the carried tree is limited.
    strip --strip-debug .gpu/bin/* .gpu/lib/*.so* 2>/dev/null || true
    du -sh .gpu
    ;;
  tests)
    out=${OUT:-/tmp}
    nvidia-smi -L || true
    export TROUPE_EXAMPLES_DIR="$here/examples"
    set +e
    timeout 560 .gpu/run troupe_gpu_tests --durations yes 2>&1 | tee "$out/gpu_tests.log"
    echo "rc=${PIPESTATUS[0]}" | tee -a "$out/gpu_tests.log"
    ;;
  bench)
    out=${OUT:-/tmp}
    export TROUPE_EXAMPLES_DIR="$here/examples"
    set +e
    timeout 120 .gpu/run troupe_bench_model_gpu 2>&1 | tee "$out/bench_model_gpu.jsonl"
    timeout 120 .gpu/run troupe_bench_generate_gpu 2>&1 | tee "$out/bench_generate_gpu.jsonl"
    [[ -x .gpu/bin/troupe_bench_nccl ]] && timeout 90 .gpu/run troupe_bench_nccl 2>&1 | tee "$out/bench_nccl.jsonl"
    timeout 330 .gpu/run troupe_bench_rl_job --only gpu 2>&1 | tee "$out/bench_rl_gpu.jsonl"
    ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
