#!/usr/bin/env bash
# Expert parallelism on this machine: inputs/llama-moe-tiny.toml at dp 4
# (4 ranks oversubscribing the cores, OPENBLAS_NUM_THREADS=1), ep 1, 2
# and 4 at each ZeRO stage of ZEROS, one run each of STEPS steps: tokens/s, the all-to-all time per
# step the trainer measured (ep_alltoall_ms: the exchanges' own spans, also
# in the Chrome traces as "expert all-to-all"), the MB each rank sent in
# them, and `plan --as-given`'s prediction of the same (ep_comm_s, with a
# machine file `calibrate` measured first on this deck), and each rank's
# memory predicted and measured.
#   OUT=bench-out STEPS=8 ZEROS="0 3" PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/moe_ep
STEPS=${STEPS:-8}
mkdir -p "$OUT"
prep_corpus byte
deck=inputs/llama-moe-tiny.toml
echo "== $(date -u +%F) $(nproc) cores, $(git rev-parse --short HEAD), $deck at dp 4, $STEPS steps of 32 x 64 tokens, host back end, OPENBLAS_NUM_THREADS=1"
machine="$OUT/machine.toml"
mpirun --oversubscribe -np 4 "$BIN" calibrate "$deck" --name "this 2-core machine" \
  --output "$machine" </dev/null >"$OUT/calibrate.log" 2>&1 || { cat "$OUT/calibrate.log"; exit 1; }
echo "| zero | ep | experts per rank | tokens/s | all-to-all ms per step, measured | predicted | MB sent per rank per step | memory per rank MB, predicted | measured |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for zero in ${ZEROS:-0 3}; do
for ep in 1 2 4; do
  lay=(--set parallel.dp=4 --set parallel.ep="$ep" --set parallel.zero="$zero"
       --set train.micro_batch=8 --set train.steps="$STEPS")
  dir="$OUT/zero${zero}_ep$ep"
  rm -rf "$dir"
  "$BIN" plan "$deck" "${lay[@]}" --machine "$machine" --as-given --json --ranks-per-node 4 \
    >"$dir.plan.json" </dev/null || { cat "$dir.plan.json"; exit 1; }
  mpirun --oversubscribe -np 4 "$BIN" train "$deck" "${lay[@]}" --set train.log_every=1 \
    --set train.eval_every=0 --set checkpoint.at_end=false --set run.trace=true \
    --set run.peak_tflops=1 --set run.dir="$dir" >"$dir.log" 2>&1 </dev/null ||
    { tail -20 "$dir.log"; exit 1; }
  /usr/bin/python3 - "$dir.plan.json" "$dir/metrics.jsonl" "$ep" "$zero" <<'PY'
import json, statistics, sys
plan = json.load(open(sys.argv[1]))["layouts"][0]
recs = [json.loads(l) for l in open(sys.argv[2])]
steps = [r for r in recs if "tokens_per_s" in r][1:]
tps = statistics.median(r["tokens_per_s"] for r in steps)
ms = statistics.median(r.get("ep_alltoall_ms", 0.0) for r in steps)
mb = statistics.median(r.get("ep_sent_mb", 0.0) for r in steps)
mem = [r for r in recs if "memory_measured" in r][0]["memory_measured"]
measured = max(m["peak_growth"] for m in mem) / 1e6
predicted = (plan["memory"][0] + plan["runtime"]) / 1e6
ep, zero = int(sys.argv[3]), sys.argv[4]
print(f"| {zero} | {ep} | {8 // ep} | {tps:.0f} | {ms:.1f} | {1e3 * plan['ep_comm_s']:.1f} | {mb:.2f} "
      f"| {predicted:.0f} | {measured:.0f} |")
PY
done
done
