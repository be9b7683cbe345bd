#!/usr/bin/env bash
# The key test of data + pipeline parallelism: the same deck and seed under
# (dp, pp) = (2,1), (4,1), (1,2), (2,2), (1,4), with every schedule
# (interleaved: two chunks per stage at pp 2, and chunks of unequal
# length), and runs resumed under another schedule and chunk count, give the loss, the grad norm and the
# validation loss of the one-rank run at every step, to a relative 1e-5. fp32 summation order is the only difference: DP
# sums micro-batch gradients in another grouping, and the tied embedding's
# two gradient halves are added after, not during, backward. Differences
# seen are around 1e-7 (zb-h1 splits each backward into B and W and runs
# the same products in the same order: its numbers are 1F1B's); 1e-5 leaves room for AdamW to amplify them over 6
# steps, while a real bug (a gradient averaged instead of summed, a
# micro-batch dropped, the tied copies diverging) moves the loss by far more.
# Also checks the tied-embedding copies and the Chrome traces.
#
# EXTRA_ARGS (words) go to every run: the GPU suite runs this file with
# "--set run.device=cuda" (ranks then share the machine's GPUs, through NCCL
# where each has its own and through host-staged MPI where they share one).
source "$(dirname "$0")/lib.sh"
if [ -n "${GPU_PROBE:-}" ]; then "$GPU_PROBE" || exit $?; fi
prep_sample_data
read -r -a extra <<<"${EXTRA_ARGS:-}"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        "${extra[@]}")

run() {  # dp pp schedule [extra...]; NAME: the run's directory (run_NAME), if not run_dp_pp_schedule; REF: the run to match (NAME's), if not run_1_1_1f1b
  local dp=$1 pp=$2 sched=$3
  shift 3
  local dir="$WORK/run_${NAME:-${dp}_${pp}_${sched}}"
  run_mpi $((dp * pp)) train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" \
    --set parallel.dp="$dp" --set parallel.pp="$pp" --set parallel.schedule="$sched" \
    --set run.dir="$dir" "$@" >"$dir.log" 2>&1 || { cat "$dir.log"; fail "run $dp x $pp $sched failed"; }
  if [ "$pp" -gt 1 ]; then
    grep -q "tied embedding: first and last stage copies are identical" "$dir.log" ||
      fail "$dp x $pp $sched: tied embedding copies not confirmed identical"
  fi
  python3 - "$WORK/run_${REF:-1_1_1f1b}/metrics.jsonl" "$dir/metrics.jsonl" "$dp x $pp $sched" <<'PY'
import json, sys
# Step and evaluation lines (the memory records differ by layout).
ref = [j for j in map(json.loads, open(sys.argv[1])) if "step" in j]
got = [j for j in map(json.loads, open(sys.argv[2])) if "step" in j]
# A run stopped at step 3 (to be resumed) has the first 4 lines.
assert len(ref) == 8 and len(got) in (4, 8), f"expected 6 step and 2 eval lines, got {len(got)}"
worst = 0.0
for r, g in zip(ref, got):
    assert r["step"] == g["step"]
    for key in ("loss", "grad_norm", "val_loss"):
        if key in r:
            rel = abs(g[key] - r[key]) / abs(r[key])
            worst = max(worst, rel)
            assert rel <= 1e-5, f"{sys.argv[3]}: step {r['step']} {key} {g[key]!r} vs one rank {r[key]!r} (rel {rel:.2e})"
print(f"{sys.argv[3]}: matches the one-rank run, worst relative difference {worst:.2e}")
PY
}

run 1 1 1f1b
run 2 1 1f1b
# LAYOUT_CASES=short (the host's rehearsal of the GPU suite): one layout
# per schedule and the traced (2,2); the host's own run takes them all.
if [ "${LAYOUT_CASES:-all}" = all ]; then
  run 4 1 1f1b
  for sched in 1f1b gpipe zb-h1; do
    run 1 2 "$sched"
    run 1 4 "$sched"
  done
  run 2 2 gpipe
else
  run 1 2 gpipe
  run 1 4 1f1b
fi
run 2 2 zb-h1 --set run.trace=true
# Interleaved 1F1B: two chunks of one layer per stage, alone and with
# replicas, ZeRO 3 and attention recomputation.
run 1 2 interleaved --set parallel.virtual_stages=2 --set run.trace=true
# Each rank's trace names the chunk of every pass: 6 steps x 4 micro-batches
# x 2 chunks forward and backward.
python3 - "$WORK/run_1_2_interleaved" <<'PY'
import json, sys
for rank in range(2):
    ev = [e for e in json.load(open(f"{sys.argv[1]}/trace-rank{rank}.json")) if e["ph"] == "X"]
    for op in ("forward", "backward"):
        chunks = [e["args"]["chunk"] for e in ev if e["name"] == op]
        assert sorted(set(chunks)) == [0, 1] and len(chunks) == 6 * 4 * 2, (rank, op, len(chunks))
print("traces: every interleaved pass names its chunk")
PY
# LAYOUT_CASES=short: the (1,2) case above only.
if [ "${LAYOUT_CASES:-all}" = all ]; then
NAME=2_2_interleaved_zero3 run 2 2 interleaved --set parallel.virtual_stages=2 \
  --set parallel.zero=3 --set train.recompute=attention
# The optimizer offloaded at zero 3: on a GPU the shard's gradients live
# in host memory, each block's sums coming down during backward and the
# tied embedding's pair summed on the device before (zero_shards.hpp).
NAME=2_2_interleaved_zero3_offload run 2 2 interleaved --set parallel.virtual_stages=2 \
  --set parallel.zero=3 --set train.offload='"host"'

# Checkpoints across schedules and chunk counts: an interleaved run's
# step 3 continued under 1F1B on another layout, and a 1F1B run's under
# interleaving, both give the straight one-rank run's numbers.
resume() {  # from to dp pp schedule [extra...]
  local from=$1 to=$2
  shift 2
  mkdir -p "$WORK/run_$to" && cp -r "$WORK/run_$from/checkpoints" "$WORK/run_$from/metrics.jsonl" \
    "$WORK/run_$to/"
  NAME=$to run "$@"
  grep -q "resumed from .*step_00000003.h5: step 3" "$WORK/run_$to.log" || fail "$to: no resume line"
}
NAME=il3 run 1 2 interleaved --set parallel.virtual_stages=2 --set train.stop_at=3
NAME=dp3 run 2 1 1f1b --set train.stop_at=3
resume il3 il_to_1f1b 2 1 1f1b
resume dp3 dp_to_il 1 2 interleaved --set parallel.virtual_stages=2
fi

# Interleaving whose layers do not cut evenly: 6 layers into 2 x 2 chunks,
# the first (the embedding's) and the last (the head's) one layer short
# (Meta's cut of Llama 3 405B), against the one-rank run of the same 6
# layers; with replicas at ZeRO 3, its step-3 checkpoint resumed under
# 1F1B on another layout, and a 1F1B run's resumed under it.
six=(--set model.n_layer=6)
REF=six NAME=six run 1 1 1f1b "${six[@]}"
REF=six NAME=six_il3 run 1 2 interleaved --set parallel.virtual_stages=2 --set train.stop_at=3 \
  "${six[@]}"
grep -q "stage 0 holds layers \[0, 1) and \[3, 5)" "$WORK/run_six_il3.log" ||
  fail "6 layers on 2 x 2 chunks: stage 0 should hold [0, 1) and [3, 5)"
# Of stage 0's 5 slots (4 micro-batches), 2 only ever hold chunk 0, its
# one layer alone (PipelineSchedule.SlotKinds counts them).
slots="5 activation slot(s) on stage 0 (one chunk each; 2 of them the first chunk's 1 layer(s) alone)"
grep -qF "$slots" "$WORK/run_six_il3.log" ||
  fail "6 layers on 2 x 2 chunks: the log should say \"$slots\""
if [ "${LAYOUT_CASES:-all}" = all ]; then
  REF=six NAME=six_il_zero3 run 2 2 interleaved --set parallel.virtual_stages=2 \
    --set parallel.zero=3 "${six[@]}"
  REF=six resume six_il3 six_il_to_1f1b 2 1 1f1b "${six[@]}"
  REF=six NAME=six_dp3 run 2 1 1f1b --set train.stop_at=3 "${six[@]}"
  REF=six resume six_dp3 six_dp_to_il 1 2 interleaved --set parallel.virtual_stages=2 "${six[@]}"
fi

# Every rank wrote a loadable trace with its spans, named by rank and stage.
python3 - "$WORK/run_2_2_zb-h1" <<'PY'
import json, sys
for rank in range(4):
    ev = json.load(open(f"{sys.argv[1]}/trace-rank{rank}.json"))
    names = {e["name"] for e in ev if e["ph"] == "X"}
    meta = [e["args"]["name"] for e in ev if e["name"] == "process_name"]
    stage = rank // 2
    assert meta == [f"rank {rank} (stage {stage}, replica {rank % 2}, tensor rank 0)"], meta
    want = {"forward", "backward", "weight_gradients", "reduce_gradients", "optimizer_step"}
    want |= {"send_activation", "recv_gradient"} if stage == 0 else {"recv_activation", "send_gradient"}
    assert want <= names, (rank, want - names)
    for op in ("forward", "backward", "weight_gradients"):
        assert sum(1 for e in ev if e["name"] == op) == 6 * 2, f"{op}: 6 steps x 2 micro-batches"
print("traces: 4 ranks, spans and track names present")
PY
