#!/usr/bin/env bash
# Precisions on this machine's host back end (issue 26), in one run:
#  - the gpt2-124m step at micro-batch 4, seq_len 256 (bench_step: synthetic
#    tokens), fp32 and bf16 alternating ROUNDS times, each precision's best
#    round: tokens/s and their ratio, model FLOP/s against the peak of the
#    precision's own GEMM path measured in the same process (fp32: OpenBLAS
#    sgemm as configured; bf16: oneDNN), and the share of the step outside
#    GEMMs;
#  - memory per rank of gpt2-124m in fp32, bf16 and fp16 (a 2-step training
#    run each): predicted by the memory accounting and measured (growth of
#    resident memory), and tokens/s of those runs.
# Threads: the automatic choice (both cores for one rank); OPENBLAS_NUM_THREADS
# is not set, so the BLAS, oneDNN and the loops share them.
#   ROUNDS=3 STEPS=3 OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
unset OPENBLAS_NUM_THREADS
OUT=${OUT:-bench-out}/precision
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
STEP_BIN=build/$PRESET/bench/mpiformer_bench_step
echo "== $(date -u +%F) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo unknown), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
for r in $(seq 1 "$ROUNDS"); do
  for p in fp32 bf16; do
    "$STEP_BIN" inputs/gpt2-124m.toml --set model.seq_len=256 --set train.micro_batch=4 \
      --set train.global_batch=4 --set train.precision="\"$p\"" --steps "$STEPS" \
      --json "$OUT/step_${p}_$r.json" >"$OUT/step_${p}_$r.log" 2>&1
    sed -n 's/^step *//p' "$OUT/step_${p}_$r.log" | sed "s/^/round $r $p: /"
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
best = {}
for p in ("fp32", "bf16"):
    runs = [json.load(open(f"{out}/step_{p}_{r}.json")) for r in range(1, rounds + 1)]
    best[p] = max(runs, key=lambda j: j["tokens_per_s"])
for p, j in best.items():
    print(f"{p}: best {j['tokens_per_s']:.0f} tokens/s ({j['step_ms']:.0f} ms), model "
          f"{j['model_gflops']:.1f} GFLOP/s = {100 * j['fraction_of_peak']:.1f}% of its GEMM peak "
          f"{j['peak_gflops']:.1f} GFLOP/s, outside GEMMs {100 * j['non_matmul_fraction']:.1f}%")
print(f"bf16 / fp32 tokens/s: {best['bf16']['tokens_per_s'] / best['fp32']['tokens_per_s']:.2f}x")
PY

echo "== memory per rank, gpt2-124m, micro-batch 4, seq_len 256, 2 steps"
prep_corpus gpt2
for p in fp32 bf16 fp16; do
  dir=$OUT/train_$p
  rm -rf "$dir"
  "$BIN" train inputs/gpt2-124m.toml --set model.seq_len=256 --set train.micro_batch=4 \
    --set train.global_batch=4 --set train.steps=2 --set train.log_every=1 --set train.eval_every=0 \
    --set data.val='""' --set checkpoint.at_end=false --set checkpoint.resume=never \
    --set train.precision="\"$p\"" --set run.dir="$dir" >"$dir.log" 2>&1
  python3 - "$dir/metrics.jsonl" "$p" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
pred = [r["memory_predicted"] for r in recs if "memory_predicted" in r][0][0]["total"]
meas = max(m["peak_growth"] for r in recs if "memory_measured" in r for m in r["memory_measured"])
tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r][-1]
print(f"{sys.argv[2]}: predicted {pred / 1e6:.0f} MB, measured {meas / 1e6:.0f} MB "
      f"({100 * (meas - pred) / pred:+.1f}%), step 2 at {tps:.0f} tokens/s")
PY
done
