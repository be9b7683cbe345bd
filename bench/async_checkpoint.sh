#!/usr/bin/env bash
# What a save costs training, synchronous against [checkpoint] async: a
# 2-rank data-parallel run of MODEL (default gpt2-124m at seq 64) saving
# every EVERY steps for STEPS steps, for each PRECISION. The saves on the
# way are compared (the last one is synchronous in both runs): "stall" is
# the time training stopped for each, from the log (a synchronous save
# whole; an asynchronous one's snapshot and layout, and any wait for the
# previous write). The first background save also allocates its snapshot
# (later ones reuse it): the stall is given for the first and the rest.
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
    read -r saves first rest step mb <<<"$(python3 - "$out/log" "$run/metrics.jsonl" "$STEPS" <<'PY'
import json, re, sys
log, metrics, steps = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
stalls = {}
for step, t in re.findall(r"checkpoint: step (\d+) taken in ([0-9.]+) s", log):
    stalls[int(step)] = float(t)
for step, t in re.findall(r"checkpoint: wrote \S+step_0*(\d+)\.h5 \([0-9.]+ MB in ([0-9.]+) s", log):
    stalls[int(step)] = float(t)
on_way = sorted(s for s in stalls if s < steps)
# A wait for step M's write belongs to the save after M that made it.
for t, m in re.findall(r"training waited ([0-9.]+) s for the background write of step (\d+)", log):
    later = [s for s in on_way if s > int(m)]
    if later: stalls[later[0]] += float(t)
first = stalls[on_way[0]]
rest = sum(stalls[s] for s in on_way[1:]) / max(1, len(on_way) - 1)
ms = [json.loads(l)["step_ms"] for l in open(metrics) if '"step_ms"' in l]
mb = re.findall(r"\(([0-9.]+) MB", log)[-1]
print(len(on_way), first, rest, sum(ms) / len(ms), mb)
PY
)"
    [ "$mode" = false ] && sync_stall=$rest
    ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.3f}')" "$rest" "$sync_stall")
    printf "| %s %s | %s | %.2f | %.2f | %s | %.0f | %s |\n" "$precision" \
      "$([ "$mode" = true ] && echo async || echo sync)" "$saves" "$first" "$rest" "$ratio" "$step" "$mb"
  done
done
