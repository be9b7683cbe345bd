#!/usr/bin/env bash
# Produces the figures recorded in bench/RESULTS.md: the kernel benchmarks
# and the end-to-end step of the gpt2-124m shape at micro-batch 4 and
# seq_len 64 and 256, one rank, BLAS_THREADS BLAS threads (default 2).
#   PRESET=cpu  OUT=bench-out  BLAS_THREADS=2  STEPS=3
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-cpu}
OUT=${OUT:-bench-out}
STEPS=${STEPS:-3}
export OPENBLAS_NUM_THREADS=${BLAS_THREADS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash .ci/deps.sh
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET"
B=build/$PRESET/bench
mkdir -p "$OUT"
echo "== $(date -u +%F) $(uname -m) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo unknown), OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS"
lscpu | sed -n 's/^Model name:\s*//p'
for T in 64 256; do
  echo "== end-to-end step: gpt2-124m, micro_batch 4, seq_len $T"
  "$B/mpiformer_bench_step" inputs/gpt2-124m.toml --set model.seq_len=$T --set train.micro_batch=4 \
    --set train.global_batch=4 --steps "$STEPS" --json "$OUT/step_124m_T$T.json"
done
echo "== kernels"
"$B/mpiformer_bench_kernels" --benchmark_out="$OUT/kernels.json" --benchmark_out_format=json
