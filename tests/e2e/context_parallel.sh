#!/usr/bin/env bash
# Context parallelism ([parallel] cp) against the one-rank run.
# (1) Equivalence: cp 2 and 4 alone (4 also with the plain split's chunk
#     order, [parallel] cp_chunks = "contiguous"), and with every other axis: (dp, pp,
#     tp, cp) = (1,2,1,2) 1F1B, interleaved and zb-h1, (2,1,1,2) with ZeRO
#     3, (1,1,2,2) and (2,1,2,2) with sequence parallelism (8 ranks,
#     oversubscribed), recomputation full and attention, and the Llama
#     family (grouped-query attention, rotary positions at the tokens'
#     places in the sequence) at cp 2 and cp 2 x tp 2, and a Mixture of
#     Experts (capacity and aux loss over whole sequences, expert
#     parallelism over context ranks): loss, grad norm, validation loss
#     (and the routing's metrics) of every step within 1e-5 relative of one rank, and
#     the final parameters within 1e-5 in norm. Why 1e-5: the ring sums
#     each query row's softmax block by block (online, in another order
#     than one rank's single pass) and the cp replicas' gradients are
#     summed in another order: fp32 rounding, ~3e-8 relative seen in the
#     losses. A real bug (a chunk at the wrong place, a position off, a
#     key block attended twice or skipped, dK/dV not sent home, a gradient
#     not summed over the context group) moves the loss by 1e-3 or more.
#     AdamW's eps is lib.sh's STEADY_ADAMW, so that no weight's step is
#     decided by rounding.
#     bf16 and fp16 at cp 2 against their own one-rank run within 5e-4:
#     the ring widens 16-bit rows to float where the host's attention
#     rounds its probabilities to 16 bits (1e-4 and 1.5e-5 seen).
# (2) Checkpoints are layout-free: cp 2 -> cp 1 and cp 1 -> cp 2 resumes
#     continue the straight run.
# (3) The log names the grid; the trace has the ring's spans.
# (4) Deck rules: seq_len not a multiple of 2 cp and the rank count are
#     refused, exit 2 naming the key on every rank.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        $STEADY_ADAMW)
COMPARE="$SOURCE_DIR/tests/e2e/compare_checkpoints.py"

# dir dp pp tp cp [extra...]
train() {
  local dir=$1 dp=$2 pp=$3 tp=$4 cp=$5
  shift 5
  run_mpi $((dp * pp * tp * cp)) train "$DECK" "${common[@]}" --set parallel.dp="$dp" \
    --set parallel.pp="$pp" --set parallel.tp="$tp" --set parallel.cp="$cp" \
    --set run.dir="$dir" "$@" >"$dir.log" 2>&1 || { cat "$dir.log"; fail "$dir failed"; }
}
same_model() {  # reference dir label
  python3 "$COMPARE" "$1/checkpoints/step_00000006.h5" "$2/checkpoints/step_00000006.h5" \
    1e-5 /model || fail "$3: final parameters differ from one rank's"
}

# (1) Equivalence.
train ref 1 1 1 1
cases=("1 1 1 2" "1 1 1 4" "1 1 1 4 --set parallel.cp_chunks=contiguous"
       "1 2 1 2 --set parallel.schedule=1f1b"
       "1 2 1 2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2"
       "1 2 1 2 --set parallel.schedule=zb-h1 --set train.recompute=attention"
       "2 1 1 2 --set parallel.zero=3" "1 1 2 2 --set train.recompute=full"
       "2 1 2 2 --set parallel.sequence_parallel=true")
n=0
for c in "${cases[@]}"; do
  n=$((n + 1))
  set -- $c
  dir="cp_case$n"
  train "$dir" "$@"
  label="(dp $1, pp $2, tp $3, cp $4) ${*:5}"
  compare ref/metrics.jsonl "$dir/metrics.jsonl" 1e-5 "$label"
  same_model ref "$dir" "$label"
done
DECK="$SOURCE_DIR/inputs/llama-tiny.toml"
train llama_ref 1 1 1 1
for c in "1 1 1 2" "1 1 2 2"; do
  set -- $c
  train "llama_$3_$4" "$@"
  compare llama_ref/metrics.jsonl "llama_$3_$4/metrics.jsonl" 1e-5 "llama (tp $3, cp $4)"
  same_model llama_ref "llama_$3_$4" "llama (tp $3, cp $4)"
done
# A Mixture of Experts (llama-moe-tiny: capacity 20 of a sequence's 128
# assignments per expert, so the router drops some): each expert's
# capacity and the aux loss are a whole sequence's, counted over the
# context group, so what is kept and dropped, the aux loss, the experts'
# load and the drops (compare's routing metrics) are one rank's. At cp 2,
# cp 4 with the plain split, expert parallelism over the context ranks
# (ep 2 at dp 1: every token's rows cross to the other chunk's rank), tp 2
# with sequence parallelism and full recomputation (the router again), and
# dp 2 x cp 2 with ep 4, ZeRO 3 and zb-h1 over 2 stages (8 ranks).
DECK="$SOURCE_DIR/inputs/llama-moe-tiny.toml"
train moe_ref 1 1 1 1
python3 - moe_ref/metrics.jsonl <<'PY' || fail "the MoE reference run drops nothing"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"dropped_fraction"' in l]
assert rows and all(r["dropped_fraction"] > 0 for r in rows), rows
PY
moe_cases=("1 1 1 2" "1 1 1 4 --set parallel.cp_chunks=contiguous" "1 1 1 2 --set parallel.ep=2"
           "1 1 2 2 --set parallel.sequence_parallel=true --set train.recompute=full"
           "2 2 1 2 --set parallel.ep=4 --set parallel.zero=3 --set parallel.schedule=zb-h1")
n=0
for c in "${moe_cases[@]}"; do
  n=$((n + 1))
  set -- $c
  train "moe_case$n" "$@"
  label="moe (dp $1, pp $2, tp $3, cp $4) ${*:5}"
  compare moe_ref/metrics.jsonl "moe_case$n/metrics.jsonl" 1e-5 "$label"
  same_model moe_ref "moe_case$n" "$label"
done
DECK="$SOURCE_DIR/inputs/tiny.toml"
for p in bf16 fp16; do
  train "ref_$p" 1 1 1 1 --set train.precision=$p
  train "cp2_$p" 1 1 1 2 --set train.precision=$p
  compare "ref_$p/metrics.jsonl" "cp2_$p/metrics.jsonl" 5e-4 "$p at cp 2"
done

# (2) Resume across cp, both ways.
train seg_cp2 1 1 1 2 --set train.stop_at=3
train seg_cp1 1 1 1 1 --set train.stop_at=3
for pair in "seg_cp2 1" "seg_cp1 2"; do
  set -- $pair
  dir="from_${1}_to_cp$2"
  mkdir -p "$dir" && cp -r "$1/checkpoints" "$1/metrics.jsonl" "$dir/"
  train "$dir" 1 1 1 "$2"
  grep -q "resumed from .*step_00000003.h5: step 3" "$dir.log" || fail "$dir: no resume line"
  compare ref/metrics.jsonl "$dir/metrics.jsonl" 1e-5 "$1 -> cp $2"
  same_model ref "$dir" "$1 -> cp $2"
done

# (3) The log, inspect and the trace name cp.
train traced 1 1 1 2 --set run.trace=true
grep -q "grid:  dp 1 x pp 1 x tp 1 x cp 2 (32 tokens of each sequence per rank" traced.log ||
  fail "the grid line does not name cp"
grep -q "replica = data replica x 2 + context rank" traced.log || fail "the mapping omits cp"
"$MPIFORMER" inspect traced/checkpoints/step_00000006.h5 | has "written by:  dp 1 x pp 1 x tp 1 x cp 2" ||
  fail "inspect does not name cp"
grep -q "written by dp 1 x pp 1 x tp 1 x cp 2 on 2 rank(s); now dp 1 x pp 1 x tp 1, zero 0" \
  from_seg_cp2_to_cp1.log || fail "the resume line does not name the layouts' cp"
for span in "context ring attention" "context ring block"; do
  has -c "\"name\": \"$span\"" traced/trace-rank1.json || fail "no $span span traced"
done
# The step lines: the ring's time and waits, and the bytes each rank sent
# round it per step: 4 micro-batches x 4 layers x (1 block forward + 3
# backward) of 4 x 32 rows x 2 x 128 floats.
python3 - traced/metrics.jsonl <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if "loss" in j]
for s in steps:
    assert 0 <= s["cp_wait_ms"] <= s["cp_ring_ms"], s
    want = 4 * 4 * (1 + 3) * (4 * 32 * 2 * 128 * 4) / 1e6
    assert abs(s["cp_sent_mb"] - want) < 1e-3 * want, (s["cp_sent_mb"], want)
print(f"cp metrics: ring {steps[-1]['cp_ring_ms']:.1f} ms, waits {steps[-1]['cp_wait_ms']:.1f} ms, "
      f"{steps[-1]['cp_sent_mb']:.2f} MB sent a step")
PY
echo "ok: the log names cp; the trace has the ring's spans"

# (4) Deck rules, exit 2 naming the key on every rank.
refused() {  # ranks key-text label args...
  local np=$1 key=$2 label=$3 rc=0
  shift 3
  run_mpi "$np" train "$DECK" "${common[@]}" --set run.dir=refused "$@" >refused.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat refused.log; fail "$label: exit $rc, not 2"; }
  grep -qF "$key" refused.log || { cat refused.log; fail "$label: $key not named"; }
  echo "ok: $label refused naming $key"
}
refused 2 "[parallel] cp" "seq_len 64 at cp 3" --set parallel.cp=3 --set parallel.dp=1
refused 2 "[parallel] dp x pp x tp x cp" "4 ranks' layout on 2" --set parallel.cp=2 \
  --set parallel.dp=2
