#!/usr/bin/env bash
# What a save costs training, synchronous against [checkpoint] async: a
# 2-rank data-parallel run of MODEL (default gpt2-124m at seq 64) saving
# every EVERY steps for STEPS steps, for each PRECISION. The saves on the
# way are compared (the last one is synchronous in both runs): "stall" is
# the time training stopped for each, from the log (a synchronous save
# whole; an asynchronous one's checksums and layout, the next update's
# wait for its snapshot where a thread copies it beside that step, and any
# wait for the previous write). The first background save also allocates
# its snapshot (later ones reuse it): the stall is given for the first and
# the rest.
# The mean step time shows what a background write costs the steps it
# runs beside (two cores: the writer thread shares them with training).
#   MODEL=inputs/gpt2-124m.toml STEPS=30 EVERY=10 PRECISIONS="fp32 bf16"
source "$(dirname "$0")/lib.sh"
MODEL=${MODEL:-inputs/gpt2-124m.toml}
STEPS=${STEPS:-30}
EVERY=${EVERY:-10}
PRECISIONS=${PRECISIONS:-fp32 bf16}
prep_corpus gpt2
out=$(mktemp -d /tmp/mpiformer-async-XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), $MODEL, dp 2, $STEPS steps, a save every $EVERY"
echo "| precision | saves on the way | stall, first (s) | stall, the rest (s) | vs synchronous | mean step (ms) | checkpoint MB |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for precision in $PRECISIONS; do
  sync_stall=""
  for mode in false true; do
    run="$out/$precision-$mode"
    mpirun --oversubscribe -np 2 "$BIN" train "$MODEL" --set parallel.dp=2 --set model.seq_len=64 \
      --set train.micro_batch=2 --set train.global_batch=4 --set train.steps="$STEPS" \
      --set train.eval_every=0 --set train.log_every=1 --set train.precision="$precision" \
      --set checkpoint.every="$EVERY" --set checkpoint.async="$mode" \
      --set checkpoint.keep=1 --set run.dir="$run" --set run.peak_tflops=1 \
      >"$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
    read -r saves first rest step mb <<<"$(python3 bench/checkpoint_stalls.py "$out/log" "$run/metrics.jsonl" "$STEPS")"
    [ "$mode" = false ] && sync_stall=$rest
    ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.3f}')" "$rest" "$sync_stall")
    printf "| %s %s | %s | %.2f | %.2f | %s | %.0f | %s |\n" "$precision" \
      "$([ "$mode" = true ] && echo async || echo sync)" "$saves" "$first" "$rest" "$ratio" "$step" "$mb"
  done
done
