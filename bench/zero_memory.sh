#!/usr/bin/env bash
# ZeRO and recomputation on this machine (host back end, one BLAS thread per
# rank), measured by the trainer itself:
#  - for each zero stage x recompute mode of one model at dp = DP: the
#    predicted bytes per rank (memory_predicted's total of stage 0), the
#    measured growth of peak resident memory of the largest rank
#    (memory_measured), tokens/s (mean of the steps after the first), the
#    bytes each rank sent to its group per step (dp_sent_mb), and each
#    ratio to zero 0 / none;
#  - with BIG=1 instead: a shape that the trainer refuses replicated (it
#    does not fit this machine's memory) and that trains at zero 3 with
#    full recomputation (a few steps, their losses and memory shown).
# Micro-batches per step: 2, so zero 2's reduce-scatter per micro-batch
# (against zero 1's once per step) shows in the bytes.
#   MODEL=inputs/gpt2-350m.toml SEQ=256 DP=2 STEPS=3 OUT=bench-out PRESET=cpu
#   EXTRA="--set train.precision=bf16"  more settings for every run
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/zero
MODEL=${MODEL:-inputs/gpt2-350m.toml}
SEQ=${SEQ:-256}
DP=${DP:-2}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
prep_corpus gpt2
common=(--set model.seq_len="$SEQ" --set train.micro_batch=1 --set train.global_batch=$((2 * DP))
        --set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set parallel.dp="$DP"
        --set checkpoint.resume=never)
read -r -a extra <<<"${EXTRA:-}"
common+=("${extra[@]}")


run() {  # dir zero recompute [extra...]
  local dir=$OUT/$1 zero=$2 rc=$3
  shift 3
  rm -rf "$dir"
  mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" --set parallel.zero="$zero" \
    --set train.recompute="$rc" --set run.dir="$dir" --set checkpoint.dir="$dir/ckpt" "$@" \
    >"$dir.log" 2>&1
  rm -rf "$dir/ckpt"  # GBs each; the benchmark measures training, not saving
}

if [ -n "${BIG:-}" ]; then
  # A shape with 0.76 G parameters: replicated, 12 GB of weights, gradients
  # and moments per rank, refused on a 24 GB machine at dp 2; zero 3 leaves
  # a rank 6 GB of shard and a few blocks.
  big=(--set model.n_layer=24 --set model.n_embd=1536 --set model.n_head=16 --set model.seq_len=128)
  rm -rf "$OUT/big_replicated"
  if mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" "${big[@]}" \
      --set run.dir="$OUT/big_replicated" >"$OUT/big_replicated.log" 2>&1; then
    echo "the replicated run was not refused: see $OUT/big_replicated.log"
  else
    echo "replicated (zero 0): $(grep -o 'stage 0 needs about [^(]*' "$OUT/big_replicated.log" | head -1) - refused"
  fi
  run big_zero3 3 full "${big[@]}"
  grep -E "^step [0-9]" "$OUT/big_zero3.log" || { tail "$OUT/big_zero3.log"; exit 1; }
  read -r pred meas tps sent < <(run_summary "$OUT/big_zero3" dp_sent_mb)
  echo "zero 3 + full: predicted $pred MB per rank, measured $meas MB, $tps tokens/s"
  exit 0
fi

echo "| zero | recompute | predicted MB/rank | measured MB/rank | vs predicted | tokens/s | sent MB/step/rank | memory vs zero 0 | tokens/s vs zero 0 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
base_mem="" base_tps=""
# CONFIGS="0 none,1 none,...": "zero recompute" pairs; the first is the ratios' base.
cfgs=("0 none" "0 attention" "0 full" "1 none" "2 none" "3 none" "3 full")
[ -z "${CONFIGS:-}" ] || IFS=, read -r -a cfgs <<<"$CONFIGS"
for cfg in "${cfgs[@]}"; do
  set -- $cfg
  run "z$1_$2" "$1" "$2"
  read -r pred meas tps sent < <(run_summary "$OUT/z$1_$2" dp_sent_mb)
  [ -n "$base_mem" ] || { base_mem=$meas; base_tps=$tps; }
  awk -v z="$1" -v r="$2" -v p="$pred" -v m="$meas" -v t="$tps" -v s="$sent" -v bm="$base_mem" \
      -v bt="$base_tps" 'BEGIN { printf "| %s | %s | %d | %d | %+.1f%% | %.1f | %d | %.2f | %.2f |\n",
      z, r, p, m, 100 * (m - p) / p, t, s, m / bm, t / bt }'
done
