#!/usr/bin/env bash
# The pipeline bubble of each schedule, measured from the ranks' traces on
# this machine (host back end, one BLAS thread per rank): gpt2-124m-shaped
# blocks, LAYERS of them (16: 4 a stage at pp = 4, so that interleaving
# with V = 2 chunks cuts them evenly), M micro-batches of MB sequences per
# step. TOKENS=byte (the default) gives the model a 256-token vocabulary,
# so that the stages are equal and the bubble is the schedule's; with
# TOKENS=gpt2 the last stage also holds GPT-2's 50257-row head (about 5
# blocks' work) and paces the pipeline, the others waiting for it. Per rank and step (the first step left out: it warms caches and
# pools), the bubble is the share of the step's span (its first action's
# start to the optimizer step's start, the same on every rank) in which
# the rank neither computes (forward, backward, W) nor reduces: waiting for
# a neighbour, or idle before the step's end. Beside it, each schedule's
# theory from the F, B and W times measured in the same run:
#   1f1b:  (pp - 1)(F + B + W) / (M (F + B + W) + (pp - 1)(F + B + W))
#   zb-h1: (pp - 1)(F + B - W) / (M (F + B + W) + (pp - 1)(F + B - W))
#   interleaved: (pp - 1)(F + B) / (M V (F + B) + (pp - 1)(F + B)), F and
#     B there a chunk's pass (a V-th of a stage)
# (B and W are one action under 1F1B: B + W is its backward's mean time).
# pp = 4 ranks on 2 cores: ranks that compute share the cores, so a rank
# waiting frees time for another; the comparison is between schedules in
# the same conditions, not a prediction for one core per rank.
#   MODEL=inputs/gpt2-124m.toml LAYERS=16 TOKENS=byte SEQ=128 MB=1 M=8 PP=4 V=2 STEPS=4
#   OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
TOKENS=${TOKENS:-byte}
OUT=${OUT:-bench-out}/pipeline_bubble_$TOKENS
MODEL=${MODEL:-inputs/gpt2-124m.toml}
SEQ=${SEQ:-128}
MB=${MB:-1}
M=${M:-8}
PP=${PP:-4}
V=${V:-2}
LAYERS=${LAYERS:-16}
STEPS=${STEPS:-4}
mkdir -p "$OUT"
prep_corpus "$TOKENS"
vocab=()
[ "$TOKENS" = byte ] && vocab=(--set model.vocab_size=256 --set data.train=data/tinyshakespeare_byte.h5)
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), $MODEL ($TOKENS tokens) $LAYERS layers, seq $SEQ, pp $PP, $M micro-batches of $MB, interleaved over $V chunks"
common=(--set model.n_layer="$LAYERS" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.global_batch=$((M * MB))
        --set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set checkpoint.resume=never
        --set checkpoint.every=0 --set checkpoint.at_end=false --set run.trace=true
        --set parallel.pp="$PP" "${vocab[@]}")

echo "| schedule | bubble measured (mean of ranks) | per rank | theory from measured F, B, W | F / B / W ms | step s | tokens/s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for sched in 1f1b zb-h1 interleaved; do
  dir="$OUT/$sched"
  rm -rf "$dir"
  chunks=1
  [ "$sched" = interleaved ] && chunks=$V
  mpirun --oversubscribe -np "$PP" "$BIN" train "$MODEL" "${common[@]}" \
    --set parallel.schedule="$sched" --set parallel.virtual_stages="$chunks" \
    --set run.dir="$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  python3 - "$dir" "$PP" "$M" "$sched" "$chunks" <<'PY'
import json, sys
d, pp, m, sched, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
compute = {"forward", "backward", "weight_gradients"}
spans = {r: [e for e in json.load(open(f"{d}/trace-rank{r}.json")) if e.get("ph") == "X"]
         for r in range(pp)}
steps = sorted({e["args"]["step"] for r in spans for e in spans[r]})[1:]
per_rank, times = [], {"forward": [], "backward": [], "weight_gradients": []}
step_s = []
for r in range(pp):
    fracs = []
    for s in steps:
        ev = [e for e in spans[r] if e["args"]["step"] == s]
        # The step's window: its earliest action on any rank to the last
        # rank's optimizer step (whose gradient-norm all-reduce the others
        # wait in).
        t0 = min(e["ts"] for q in spans for e in spans[q] if e["args"]["step"] == s)
        t1 = max(e["ts"] for q in spans for e in spans[q]
                 if e["args"]["step"] == s and e["name"] == "optimizer_step")
        busy = sum(e["dur"] for e in ev if e["name"] in compute)
        fracs.append(1 - busy / (t1 - t0))
        if r == 0:
            step_s.append((t1 - t0) / 1e6)
        for e in ev:
            if e["name"] in times:
                times[e["name"]].append(e["dur"] / 1e3)
    per_rank.append(sum(fracs) / len(fracs))
mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
F, Bt, W = mean(times["forward"]), mean(times["backward"]), mean(times["weight_gradients"])
if sched == "zb-h1":
    lost = (pp - 1) * (F + Bt - W)
else:  # 1F1B, or interleaved's chunk passes (F and B a V-th of a stage's)
    lost = (pp - 1) * (F + Bt)
theory = lost / (m * v * (F + Bt + W) + lost)
recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
tps = mean([x["tokens_per_s"] for x in recs if "tokens_per_s" in x][1:])
print(f"| {sched} | {mean(per_rank):.3f} | {' '.join(f'{x:.3f}' for x in per_rank)} | {theory:.3f} | "
      f"{F:.0f} / {Bt:.0f} / {W:.0f} | {mean(step_s):.2f} | {tps:.0f} |")
PY
done
