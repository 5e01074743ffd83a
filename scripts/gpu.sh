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
       build/bench/troupe_bench_weight_sync_gpu build/bench/troupe_bench_rl_job build/tools/troupe)

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
    # One test case a process, each under its own limit, all under one
    # deadline (GPU_DEADLINE_S): a hang in one case costs that case, not the
    # lease, and the log still names every case that ran and how it ended.
    out=${OUT:-/tmp}
    log="$out/gpu_tests.log"
    deadline=$((SECONDS + ${GPU_DEADLINE_S:-560}))
    nvidia-smi -L 2>&1 | tee "$log" || true
    export TROUPE_EXAMPLES_DIR="$here/examples" TROUPE_CLI="$here/.gpu/bin/troupe" NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    set +e
    mapfile -t cases < <(.gpu/run troupe_gpu_tests --list-test-names-only "${2:-*}" | grep -v '^$' | grep -v 'matching test case')
    passed=0 failed=0 skipped=0
    for c in "${cases[@]}"; do
      left=$((deadline - SECONDS))
      if ((left < 10)); then echo "=== NOT RUN (deadline): $c" | tee -a "$log"; skipped=$((skipped + 1)); continue; fi
      limit=60; [[ $c == "gpu job:"* ]] && limit=240
      ((limit > left)) && limit=$left
      start=$SECONDS
      timeout -k 5 "$limit" .gpu/run troupe_gpu_tests "${c//,/\\,}" >"$out/case.log" 2>&1
      rc=$?
      status=PASS; ((rc == 0)) || status="FAIL rc=$rc"; ((rc == 124 || rc == 137)) && status="TIMEOUT ${limit}s"
      echo "=== $status ($((SECONDS - start)) s): $c" | tee -a "$log"
      if ((rc == 0)); then passed=$((passed + 1)); else failed=$((failed + 1)); tail -c 6000 "$out/case.log" >>"$log"; fi
    done
    rm -f "$out/case.log"
    echo "passed=$passed failed=$failed not_run=$skipped" | tee -a "$log"
    ((failed == 0 && skipped == 0))
    ;;
  bench)
    out=${OUT:-/tmp}
    export TROUPE_EXAMPLES_DIR="$here/examples" TROUPE_CLI="$here/.gpu/bin/troupe"
    set +e
    timeout 120 .gpu/run troupe_bench_model_gpu 2>&1 | tee "$out/bench_model_gpu.jsonl"
    timeout 120 .gpu/run troupe_bench_generate_gpu 2>&1 | tee "$out/bench_generate_gpu.jsonl"
    timeout 60 .gpu/run troupe_bench_weight_sync_gpu 2>&1 | tee "$out/bench_weight_sync_gpu.jsonl"
    [[ -x .gpu/bin/troupe_bench_nccl ]] && timeout 90 .gpu/run troupe_bench_nccl 2>&1 | tee "$out/bench_nccl.jsonl"
    timeout 330 .gpu/run troupe_bench_rl_job --only gpu 2>&1 | tee "$out/bench_rl_gpu.jsonl"
    ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
