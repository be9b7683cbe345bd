#!/usr/bin/env bash
# Context parallelism on this machine (host back end, one BLAS thread per
# rank), measured by the trainer itself: the tiny deck's model (4 layers,
# 4 heads, n_embd 128) at seq_len SEQ on 4 ranks.
# (1) Memory: cp = 4 against cp = 1 (dp = 4), one sequence per rank and
#     micro-batch either way (global batch 4): the predicted activations
#     (the kept slot) and attention's share of them, the predicted total,
#     and the measured growth of each rank's peak resident memory.
#     Attention's kept state: one rank, the probabilities [B, heads, T, T]
#     (the host's kernel); a context rank, each query row's log-sum-exp.
# (2) Balance: cp = 2 (2 ranks, a core each) and cp = 4 (4 ranks on the
#     2 cores: time-sliced, so its spans hold the other rank's turns too),
#     head-tail chunks against the plain split ([parallel] cp_chunks =
#     "contiguous"), 4 sequences a step, from the traces: each rank's time
#     in the ring's attention arithmetic ("context ring block" spans, the
#     waits for the next block left out) over the steps after the first,
#     the slowest rank against the mean.
#   SEQ=4096 STEPS=3 OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/context_parallel
SEQ=${SEQ:-4096}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
prep_corpus byte
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), inputs/tiny.toml at seq_len $SEQ, 4 ranks"
common=(--set model.seq_len="$SEQ" --set train.micro_batch=1 --set train.global_batch=4
        --set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set checkpoint.resume=never
        --set checkpoint.every=0 --set checkpoint.at_end=false)
run() {  # ranks dir args...
  local np=$1 dir=$2
  shift 2
  rm -rf "$dir"
  mpirun --oversubscribe -np "$np" "$BIN" train inputs/tiny.toml "${common[@]}" --set run.dir="$dir" \
    "$@" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
}

echo
echo "| layout | activations, predicted MB/rank | of which attention's kept state | total predicted MB/rank | measured MB/rank (fullest) | step s |"
echo "| --- | --- | --- | --- | --- | --- |"
for cp in 1 4; do
  dir="$OUT/memory_cp$cp"
  run 4 "$dir" --set parallel.dp=$((4 / cp)) --set parallel.cp="$cp"
  python3 - "$dir/metrics.jsonl" "$cp" "$SEQ" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
cp, T = int(sys.argv[2]), int(sys.argv[3])
p = [r["memory_predicted"] for r in recs if "memory_predicted" in r][0][0]
meas = max(m["peak_growth"] for r in recs if "memory_measured" in r for m in r["memory_measured"])
steps = [r for r in recs if "step_ms" in r][1:]
step = sum(r["step_ms"] for r in steps) / len(steps) / 1e3
# Attention's kept state per rank: 4 layers x 4 heads x (T x T floats, or
# T / cp log-sum-exps), one sequence.
state = 4 * 4 * (T * T if cp == 1 else T // cp) * 4
print(f"| dp {4 // cp} cp {cp} | {p['activations'] / 1e6:.1f} | {state / 1e6:.2f} | "
      f"{p['total'] / 1e6:.1f} | {meas / 1e6:.1f} | {step:.2f} |")
PY
done

echo
echo "| cp | cp_chunks | ring arithmetic s per rank | slowest / mean | step s |"
echo "| --- | --- | --- | --- | --- |"
for cp in 2 4; do
  for order in head_tail contiguous; do
    dir="$OUT/balance_cp${cp}_$order"
    run "$cp" "$dir" --set parallel.cp="$cp" --set parallel.cp_chunks="$order" --set run.trace=true
    python3 - "$dir" "$cp" "$order" <<'PY'
import json, sys
d, cp, order = sys.argv[1], int(sys.argv[2]), sys.argv[3]
per_rank = []
for r in range(cp):
    events = json.load(open(f"{d}/trace-rank{r}.json"))
    events = events["traceEvents"] if isinstance(events, dict) else events
    # The first step pays for the start: steps 2.. only.
    busy = sum(e["dur"] for e in events
               if e.get("name") == "context ring block" and e.get("args", {}).get("step", 0) >= 2)
    per_rank.append(busy / 1e6)
mean = sum(per_rank) / len(per_rank)
recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
steps = [r for r in recs if "step_ms" in r][1:]
step = sum(r["step_ms"] for r in steps) / len(steps) / 1e3
print(f"| {cp} | {order} | {' / '.join(f'{x:.2f}' for x in per_rank)} | {max(per_rank) / mean:.3f} | {step:.2f} |")
PY
  done
done
