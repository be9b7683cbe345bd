#!/usr/bin/env bash
# What a save costs training, synchronous against [checkpoint] async: a
# 2-rank data-parallel run of MODEL (default gpt2-124m at seq 64) saving
# every EVERY steps (the last too, in the background: at_end = false
# makes every save an "on the way" one), STEPS steps, for each PRECISION.
# "stall" is the run's own blocking save time (its goodput record's
# save_s: a synchronous save whole; an asynchronous one's snapshot and
# layout, any wait for a write in flight and the publishing), per save.
# The step time column shows what a background write costs the steps
# beside it (two cores: the writer thread shares them with training).
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
echo "| precision | saves | stall per save (s) | vs synchronous | mean step (ms) | checkpoint MB |"
echo "| --- | --- | --- | --- | --- | --- |"
for precision in $PRECISIONS; do
  sync_stall=""
  for mode in false true; do
    run="$out/$precision-$mode"
    mpirun --oversubscribe -np 2 "$BIN" train "$MODEL" --set parallel.dp=2 --set model.seq_len=64 \
      --set train.micro_batch=2 --set train.global_batch=4 --set train.steps="$STEPS" \
      --set train.eval_every=0 --set train.log_every=1 --set train.precision="$precision" \
      --set checkpoint.every="$EVERY" --set checkpoint.at_end=false --set checkpoint.async="$mode" \
      --set checkpoint.keep=1 --set run.dir="$run" --set run.peak_tflops=1 \
      >"$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
    mb=$(sed -n 's/.*checkpoint: wrote [^ ]* (\{0,1\}\([0-9.]*\) MB.*/\1/p' "$out/log" | tail -1)
    read -r stall saves step <<<"$(python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
g, steps = None, []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "goodput" in j: g = j["goodput"]
    elif "step_ms" in j: steps.append(j["step_ms"])
print(g["save_s"] / max(g["saves"], 1), g["saves"], sum(steps) / len(steps))
PY
)"
    [ "$mode" = false ] && sync_stall=$stall
    ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.3f}')" "$stall" "$sync_stall")
    printf "| %s %s | %s | %.3f | %s | %.0f | %s |\n" "$precision" "$([ "$mode" = true ] && echo async || echo sync)" \
      "$saves" "$stall" "$ratio" "$step" "$mb"
  done
done
