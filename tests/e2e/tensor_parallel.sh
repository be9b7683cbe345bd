#!/usr/bin/env bash
# Tensor parallelism (Megatron's partitioning) against the one-rank run.
# (1) Equivalence: (dp, pp, tp) = (1,1,2), (1,1,4), (2,1,2), (1,2,2) (every
#     schedule), (2,2,2) (8 ranks, oversubscribed; interleaved with ZeRO 2
#     and full recomputation; TP_CASES=all adds 1F1B, and zb-h1 with
#     sequence parallelism), and tp with ZeRO and recomputation, each also
#     under sequence parallelism: loss, grad norm and validation loss of every step
#     within 1e-5 relative of (1,1,1), and every final parameter tensor
#     within 1e-5 in norm (compare_checkpoints.py, which reads the files
#     with h5dump). Why 1e-5: a tensor rank computes the same products over
#     a slice of the channels and the group sums them, so each row-parallel
#     output and each input gradient is summed in another order than on one
#     rank (fp32 rounding, ~1e-7 relative seen in the losses, ~2e-6 in the
#     parameters after 6 AdamW steps). A real bug (a head or a vocabulary
#     slice in the wrong place, a bias added tp times, a missing all-reduce
#     in backward, a replicated gradient counted tp times in the norm)
#     moves the loss by 1e-3 or more.
# (2) Checkpoints across tp: (1,2,2) -> (2,1,1) and (2,1,1) -> (1,2,2)
#     continue the straight run; a damaged tensor-parallel slice is named.
# (3) The log, the trace and inspect name the tensor group; the bytes each
#     rank sends to it per step are Megatron's count (per layer two
#     all-reduces of B x T x C forward and two backward, plus the head's
#     and the cross-entropy's statistics; the embedding's token rows
#     gathered, half an all-reduce's bytes), and
#     under sequence parallelism Korthikanti et al.'s (each all-reduce a
#     reduce-scatter and an all-gather, backward's gathers of the
#     LayerNorms' outputs, the LayerNorms' weight gradients summed).
# EXTRA_ARGS (words) go to every run: the GPU suite runs this file with
# "--set run.device=cuda" (tensor groups over NCCL, or host-staged MPI
# where ranks share a GPU), and CI rehearses that on the host with
# MPIFORMER_REHEARSE_GPU=1 (src/core/test_hooks.hpp).
source "$(dirname "$0")/lib.sh"
if [ -n "${GPU_PROBE:-}" ]; then "$GPU_PROBE" || exit $?; fi
prep_sample_data
read -r -a extra <<<"${EXTRA_ARGS:-}"
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        $STEADY_ADAMW
        "${extra[@]}")
COMPARE="$SOURCE_DIR/tests/e2e/compare_checkpoints.py"

train() { train_layout "$@"; }  # dir dp pp tp [extra...] (lib.sh)
same_model() {  # dir label
  python3 "$COMPARE" ref/checkpoints/step_00000006.h5 "$1/checkpoints/step_00000006.h5" 1e-5 \
    /model || fail "$2: final parameters differ from one rank's"
}

# (1) Equivalence.
train ref 1 1 1
# The last field: sequence parallelism.
cases=("1 1 2 1f1b none 0 false" "2 1 2 1f1b none 0 false"
       "1 2 2 gpipe none 0 false" "1 2 2 zb-h1 attention 3 false"
       "2 1 2 gpipe full 3 false" "2 1 2 1f1b attention 1 false" "2 2 2 interleaved full 2 false"
       "1 1 4 1f1b none 0 true" "2 1 2 gpipe full 3 true"
       "1 2 2 1f1b attention 2 true")
# The 8-rank cases of 1F1B and zb-h1 with sequence parallelism and tp 4
# without it (each of their axes is in the cases above; 8 oversubscribed
# ranks take 20 s or more each on two cores): TP_CASES=all adds them.
# TP_CASES=2 (the host's rehearsal of the GPU suite): the first case and
# the last, one of each kind; the host's own run takes the list above.
case "${TP_CASES:-covering}" in
  all) cases+=("1 1 4 1f1b none 0 false" "2 2 2 1f1b none 0 false" "2 2 2 zb-h1 none 0 true") ;;
  covering) ;;
  *) cases=("${cases[0]}" "${cases[-1]}") ;;
esac
for c in "${cases[@]}"; do
  set -- $c
  dir="tp_$1_$2_$3_$4_$5_$6_$7"
  chunks=1
  [ "$4" = interleaved ] && chunks=2  # the tiny deck's 4 layers: 2 stages x 2 chunks
  train "$dir" "$1" "$2" "$3" --set parallel.schedule="$4" --set train.recompute="$5" \
    --set parallel.zero="$6" --set parallel.sequence_parallel="$7" \
    --set parallel.virtual_stages="$chunks"
  label="(dp $1, pp $2, tp $3) $4, recompute $5, zero $6, sequence parallel $7"
  compare ref/metrics.jsonl "$dir/metrics.jsonl" 1e-5 "$label"
  same_model "$dir" "$label"
  grep -q "tensor groups: every rank's replicated tensors match its group's" "$dir.log" ||
    fail "$label: replicated tensors not confirmed identical"
done

# (2) Resume across tp, both ways (the first from a sequence-parallel zb-h1
# run, into 1F1B), then a damaged slice.
train seg_122 1 2 2 --set train.stop_at=3 --set parallel.sequence_parallel=true \
  --set parallel.schedule=zb-h1
train seg_211 2 1 1 --set train.stop_at=3
for pair in "seg_122 2 1 1" "seg_211 1 2 2"; do
  set -- $pair
  dir="from_${1}_to_$2$3$4"
  mkdir -p "$dir" && cp -r "$1/checkpoints" "$1/metrics.jsonl" "$dir/"
  train "$dir" "$2" "$3" "$4"
  grep -q "resumed from .*step_00000003.h5: step 3" "$dir.log" || fail "$dir: no resume line"
  compare ref/metrics.jsonl "$dir/metrics.jsonl" 1e-5 "$1 -> (dp $2, pp $3, tp $4)"
  same_model "$dir" "$1 -> (dp $2, pp $3, tp $4)"
done
f=dmg.h5
cp seg_122/checkpoints/step_00000003.h5 "$f"
name=/model/h.3.mlp.c_proj.weight  # split by columns: tensor rank 1 reads the damaged half
off=$(h5dump -p -H -d "$name" "$f" | sed -n 's/.*OFFSET \([0-9]*\).*/\1/p')
[ -n "$off" ] || fail "could not find the tensor's offset"
printf '\xff' | dd of="$f" bs=1 seek=$((off + 4 * 128 * 512 - 100)) conv=notrunc status=none
rc=0
run_mpi 4 train "$DECK" "${common[@]}" --set parallel.tp=4 --set run.dir=damaged \
  --set checkpoint.resume="$f" >damaged.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat damaged.log; fail "exit $rc for a damaged checkpoint under tp 4"; }
grep -qF "$f: $name: checksum mismatch" damaged.log || { cat damaged.log; fail "not named"; }
echo "ok: a damaged tensor-parallel slice is named"

# (3) What the log, the trace and inspect say, and the bytes sent, without
# and with sequence parallelism (which must also match one rank).
train traced 1 1 2 --set run.trace=true
train traced_sp 1 1 2 --set run.trace=true --set parallel.sequence_parallel=true
compare ref/metrics.jsonl traced_sp/metrics.jsonl 1e-5 "(dp 1, pp 1, tp 2) sequence parallel"
same_model traced_sp "(dp 1, pp 1, tp 2) sequence parallel"
grep -q "grid:  dp 1 x pp 1 x tp 2 (sequence parallel)" traced_sp.log ||
  fail "the grid line does not say sequence parallel"
grep -q "grid:  dp 1 x pp 1 x tp 2" traced.log || fail "the grid line does not name tp"
grep -q "tensor groups: \[0-1\]" traced.log || fail "the rank mapping is not printed"
"$MPIFORMER" inspect traced/checkpoints/step_00000006.h5 | has "written by:  dp 1 x pp 1 x tp 2" ||
  fail "inspect does not name tp"
python3 - traced "$DECK" <<'PY'
import json, os, sys
run = sys.argv[1]
# Host runs time their tensor all-reduces; GPU runs (and the host when it
# rehearses the GPU suite) time nothing on the host and write no share.
on_gpu = any(l.startswith("device: cuda") for l in open(f"{run}.log"))
host_timings = not on_gpu and os.environ.get("MPIFORMER_REHEARSE_GPU") != "1"
for rank in range(2):
    ev = json.load(open(f"{run}/trace-rank{rank}.json"))
    meta = [e["args"]["name"] for e in ev if e["name"] == "process_name"]
    assert meta == [f"rank {rank} (stage 0, replica 0, tensor rank {rank})"], meta
    step = lambda name: [e for e in ev if e["ph"] == "X" and e["name"] == name
                         and e["args"]["micro_batch"] >= 0]  # evaluation's are the step's -1
    # Per micro-batch: all-reduces: 4 layers x (2 forward + 2 backward),
    # the head's input gradient, the loss's maximum and its sums: 19; the
    # embedding's token rows gathered: 1; 4 micro-batches a step, 6 steps.
    assert len(step("tensor all-reduce")) == 6 * 4 * 19, len(step("tensor all-reduce"))
    assert len(step("tensor all-gather")) == 6 * 4, len(step("tensor all-gather"))
# tiny: 4 layers, micro-batch 4 x 64 tokens, 128 channels; 4 micro-batches.
# Each all-reduce of n floats sends 2 n (tp - 1) / tp per rank; the
# embedding's gather of its B T rows, in the mean over the ranks (what the
# metrics report), B T C (tp - 1) / tp, however the tokens fall: a rank
# sends every part but the next rank's.
L, B, T, C, tp, M = 4, 4, 64, 128, 2, 4
elements = (4 * L + 1) * B * T * C + 3 * B * T
want = M * 4 * (2 * elements + B * T * C) * (tp - 1) / tp / 1e6
steps = [j for j in map(json.loads, open(f"{run}/metrics.jsonl")) if "loss" in j]
for j in steps:
    assert abs(j["tp_sent_mb"] - want) <= 1e-3 * want, (j["tp_sent_mb"], want)
    if host_timings:
        assert 0 < j["tp_reduce_fraction"] < 1, j
    else:
        assert "tp_reduce_fraction" not in j, ("a host timing in a GPU run's metrics", j)
print(f"trace: tensor all-reduce spans on both ranks; {want:.3f} MB sent per rank per step, as counted")
PY
python3 - traced_sp <<'PY'
import json, sys
run = sys.argv[1]
L, B, T, C, tp, M = 4, 4, 64, 128, 2, 4
for rank in range(2):
    ev = json.load(open(f"{run}/trace-rank{rank}.json"))
    spans = {}
    for e in ev:
        if e["ph"] == "X" and e["name"].startswith("tensor ") and e["args"]["micro_batch"] >= 0:
            spans[e["name"]] = spans.get(e["name"], 0) + 1
    # Per micro-batch: reduce-scatters: the embedding, 2 a block forward, 2
    # backward, the head's input gradient; all-gathers: 2 a block forward, 4
    # backward, the head's input forward and backward, the embedding's
    # gradient; all-reduces: the loss's maximum and sums, the LayerNorms'
    # gradients (one a block, the final one).
    want = {"tensor reduce-scatter": 4 * L + 2, "tensor all-gather": 6 * L + 3,
            "tensor all-reduce": 2 + L + 1}
    assert spans == {k: 6 * M * v for k, v in want.items()}, (rank, spans)
# Sent per rank (ring): each reduce-scatter and all-gather of B T C floats
# sends (tp - 1) / tp of it, each all-reduce twice that of its buffer.
BTC = B * T * C
elements = (10 * L + 5) * BTC + 2 * (3 * B * T + 4 * C * L + 2 * C)
want = M * 4 * elements * (tp - 1) / tp / 1e6
for j in (j for j in map(json.loads, open(f"{run}/metrics.jsonl")) if "loss" in j):
    assert abs(j["tp_sent_mb"] - want) <= 1e-3 * want, (j["tp_sent_mb"], want)
print(f"trace (sequence parallel): {want:.3f} MB sent per rank per step, as counted")
PY
