#!/usr/bin/env bash
# A Mixture of Experts (inputs/llama-moe-tiny.toml: 8 SwiGLU experts, top
# 2, capacity factor 1.25, so the router drops some assignments) on every
# parallel axis against its one-rank run: data (ZeRO 3 with tensor and
# sequence parallelism; ZeRO 2 with the pipeline for GPT-2), pipeline
# (interleaved, a slot position serving both chunks, with full
# recomputation; zb-h1 with ZeRO 1, its W computing the router's and the
# experts' weight gradients from what B kept), tensor (the router
# replicated, each expert's MLP split as the dense one; with ZeRO 3 and
# sequence parallelism). Loss, grad norm and validation
# loss of every step within 1e-5 relative, and every final tensor within
# 1e-5 in norm (compare_checkpoints.py), as llama.sh, for the same reason:
# only fp32 summation order differs, while a gate's gradient summed
# twice over the tensor group or a sequence routed by another's capacity
# moves the loss by 1e-3 or more. The routing itself (aux loss, experts'
# load, drops) is in the metrics and must agree too. Then GPT-2's MoE
# (biases, GELU experts, sparse and dense layers mixed), a resume under
# another layout, inspect and generate on the checkpoint, and the deck's
# refusals (exit 2, one message naming the keys, nothing written).
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/llama-moe-tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        $STEADY_ADAMW)
train() { train_layout "$@"; }  # dir dp pp tp [extra...] (lib.sh)
same() { same_run "$@"; }  # ref dir label (lib.sh: the routing's metrics too)

train ref 1 1 1
grep -q "model: mixture of experts: 8 experts in 4 of 4 layers (every 1), top 2, capacity 20 per expert per sequence" \
  ref.log || { grep "model:" ref.log; fail "the experts are not described"; }
# The test must drop assignments, or the drop path goes untested.
python3 - ref/metrics.jsonl <<'PY' || fail "the reference run drops nothing"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"dropped_fraction"' in l]
assert rows and all(r["dropped_fraction"] > 0 for r in rows), rows
PY
# dp pp tp schedule recompute zero sequence_parallel
# (Data parallelism with ZeRO 2 and a pipeline: GPT-2's case below.)
cases=("1 2 1 interleaved full 0 false" "2 2 1 zb-h1 attention 1 false"
       "2 1 2 1f1b none 3 true")
for c in "${cases[@]}"; do
  set -- $c
  dir="m_$1_$2_$3_$4_$5_$6_$7"
  chunks=1
  [ "$4" = interleaved ] && chunks=2
  train "$dir" "$1" "$2" "$3" --set parallel.schedule="$4" --set train.recompute="$5" \
    --set parallel.zero="$6" --set parallel.sequence_parallel="$7" \
    --set parallel.virtual_stages="$chunks"
  same ref "$dir" "moe (dp $1, pp $2, tp $3) $4, recompute $5, zero $6, sequence parallel $7"
done

# Expert parallelism: each sparse layer's 8 experts shared out over ep
# replicas, every token's rows sent to its experts' ranks and back, each
# expert's gradients reduced (ZeRO: reduce-scattered, its shards gathered)
# over the dp / ep replicas holding it: (4,1,1) ep 2 with ZeRO 3 (the
# experts over 2 replicas, the rest over 4, each block's window gathered
# from both); with tensor and sequence parallelism and full recomputation
# (2,1,2) ep 2 (the exchange again in backward); with a pipeline (2,2,1)
# ep 2, zb-h1 and ZeRO 1 (W from the received rows and output gradients
# B kept, exchanging nothing).
# dp pp tp ep recompute sequence_parallel zero schedule
ep_cases=("4 1 1 2 none false 3 1f1b" "2 1 2 2 full true 0 1f1b" "2 2 1 2 attention false 1 zb-h1")
for c in "${ep_cases[@]}"; do
  set -- $c
  dir="e_$1_$2_$3_ep$4"
  train "$dir" "$1" "$2" "$3" --set parallel.ep="$4" --set train.recompute="$5" \
    --set parallel.sequence_parallel="$6" --set parallel.zero="$7" --set parallel.schedule="$8"
  same ref "$dir" "moe (dp $1, pp $2, tp $3) ep $4, recompute $5, sequence parallel $6, zero $7, $8"
done
grep -q "model: expert parallel over 2 replicas: each holds 4 experts per sparse layer, its gradients reduced over the 2 replicas holding the same" \
  e_4_1_1_ep2.log || { grep "model:" e_4_1_1_ep2.log; fail "expert parallelism not described"; }
grep -q "zero 3: [0-9]* units sharded over dp (the experts' over the 2 replicas holding them)" \
  e_4_1_1_ep2.log || { grep "^grid:" e_4_1_1_ep2.log; fail "the experts' shards not described"; }

# GPT-2's experts (GELU, biases; the row-parallel bias added once) in
# layers 0 and 2 of 4, the others dense, no capacity.
gpt2=(--set model.experts=4 --set model.top_k=2 --set model.moe_every=2
      --set model.capacity_factor=0)
DECK="$SOURCE_DIR/inputs/tiny.toml" train g_ref 1 1 1 "${gpt2[@]}"
DECK="$SOURCE_DIR/inputs/tiny.toml" train g_2_2_1 2 2 1 "${gpt2[@]}" --set parallel.zero=2
same g_ref g_2_2_1 "gpt2 moe (dp 2, pp 2) zero 2"
# Interleaving with chunks of unequal length, sparse and dense blocks
# sharing a slot's positions: 6 layers (0 and 3 sparse) into 2 x 2
# chunks, stage 0's [0, 1) at its slot's second position, [3, 5) at both.
gpt6=(--set model.experts=4 --set model.top_k=2 --set model.moe_every=3
      --set model.capacity_factor=0 --set model.n_layer=6)
DECK="$SOURCE_DIR/inputs/tiny.toml" train g6_ref 1 1 1 "${gpt6[@]}"
DECK="$SOURCE_DIR/inputs/tiny.toml" train g6_il 1 2 1 "${gpt6[@]}" \
  --set parallel.schedule=interleaved --set parallel.virtual_stages=2
same g6_ref g6_il "gpt2 moe (dp 1, pp 2) interleaved, chunks of unequal length"

# Resume under another layout: (1,2,1) stopped at step 3 -> (1,1,2).
resume_run seg "1 2 1" resumed "1 1 2"
same ref resumed "moe resumed (1,2,1) -> (1,1,2)"
# Out of and into expert parallelism: (4,1,1) ep 4 (two experts a rank)
# with ZeRO 2 stopped at step 3 -> (4,1,1) ep 2, ZeRO 0 (each expert read
# by the 2 replicas holding it, the rest by all 4, then gathered).
resume_run seg_ep "4 1 1 --set parallel.ep=4 --set parallel.zero=2" \
  resumed_ep "4 1 1 --set parallel.ep=2"
same ref resumed_ep "moe resumed (4,1,1) ep 4 zero 2 -> (4,1,1) ep 2"

# inspect names the experts and finds every expert's tensors; generate
# routes each token (without a capacity).
"$MPIFORMER" inspect ref/checkpoints/step_00000006.h5 >inspect.txt
grep -q "experts:     8 per sparse layer (every 1), top 2, capacity factor 1.25" inspect.txt ||
  { cat inspect.txt; fail "inspect does not name the experts"; }
grep -q "checksums:   all" inspect.txt || { cat inspect.txt; fail "inspect: checksums"; }
generates ref/checkpoints/step_00000006.h5

# Export as Mixtral (sharded), checked by an independent numpy forward
# (llama_numpy.py: Mixtral's block_sparse_moe from its definition) against
# generate's logits, and read back by [model] init; GPT-2's experts and a
# model with dense layers have no Hugging Face layout, and llm.c's file
# none for experts: refused.
need_numpy
ck=ref/checkpoints/step_00000006.h5
"$MPIFORMER" export "$ck" --format hf --max-shard-mb 1 --output hf >export.log ||
  { cat export.log; fail "export"; }
grep -q "as a Hugging Face MixtralForCausalLM directory" export.log || fail "export: not named Mixtral"
"$PY" "$SOURCE_DIR/tests/e2e/llama_numpy.py" hf hf
numpy_logits "$ck" hf
# init from the Mixtral export under (1,1,2) starts where init from the
# checkpoint starts on one rank; a deck whose experts differ is refused.
train init_ck 1 1 1 --set model.init="$ck" --set train.steps=2 --set train.eval_every=0
train init_hf 1 1 2 --set model.init=hf --set train.steps=2 --set train.eval_every=0
grep -q "init: weights from hf/model.safetensors.index.json (Hugging Face" init_hf.log ||
  { grep "init" init_hf.log; fail "init from the Mixtral export: no init line"; }
compare init_ck/metrics.jsonl init_hf/metrics.jsonl 1e-5 "moe init from the Mixtral export"
rc=0
run_mpi 1 train "$DECK" "${common[@]}" --set model.init=hf --set model.experts=4 \
  --set run.dir=init_bad >init_bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "[model] experts: 4, but [model] init's hf/model.safetensors.index.json holds 8" \
  init_bad.log || { cat init_bad.log; fail "init with other experts: exit $rc"; }
no_export() {  # label checkpoint format expected-text
  local rc=0
  "$MPIFORMER" export "$2" --format "$3" --output "no_$1" >/dev/null 2>"no_$1.err" || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "$4" "no_$1.err" && [ ! -e "no_$1" ] ||
    { cat "no_$1.err"; fail "export $1 not refused (exit $rc)"; }
}
no_export gpt2 g_ref/checkpoints/step_00000006.h5 hf "a Mixture of Experts exports as Mixtral, a Llama with every layer sparse"
no_export llmc "$ck" llmc "llm.c's parameter file holds GPT-2 only; this checkpoint is a Mixture of Experts"

# The deck's refusals: exit 2, the keys named, nothing written.
refused() {  # label expected-text [--set ...]
  local label=$1 want=$2 rc=0
  shift 2
  run_mpi 1 train "$DECK" "${common[@]}" --set run.dir="bad_$label" "$@" >"bad_$label.log" 2>&1 ||
    rc=$?
  [ "$rc" -eq 2 ] || { cat "bad_$label.log"; fail "$label: exit $rc, expected 2"; }
  grep -qF "$want" "bad_$label.log" || { cat "bad_$label.log"; fail "$label: message"; }
  [ ! -e "bad_$label/metrics.jsonl" ] && ! compgen -G "bad_$label/checkpoints/*.h5" >/dev/null ||
    fail "$label: wrote something"
  echo "ok: $label refused"
}
refused top_k "[model] top_k, [model] experts: each token picks top_k = 9 different experts of the 8" \
  --set model.top_k=9
DECK="$SOURCE_DIR/inputs/tiny.toml" refused dense "[model] top_k, [model] experts: applies to a Mixture of Experts only" \
  --set model.top_k=1
refused capacity "[model] capacity_factor: expected a value in [0, 1024], got -1" \
  --set model.capacity_factor=-1
refused ep_dp "[parallel] ep, [parallel] dp, [model] experts: ep 2 must divide both dp x cp (1" \
  --set parallel.ep=2
refused imbalance "[parallel] expert_imbalance: the busiest rank's rows over the fair share: at least 1 (or 0, automatic), got 0.5" \
  --set parallel.expert_imbalance=0.5
DECK="$SOURCE_DIR/inputs/tiny.toml" refused imbalance_dense "[parallel] expert_imbalance, [model] experts: prices a Mixture of Experts' busiest" \
  --set parallel.expert_imbalance=2
DECK="$SOURCE_DIR/inputs/tiny.toml" refused ep_dense "[parallel] ep, [model] experts: ep 2 divides a Mixture of Experts' experts over ranks; this model is dense" \
  --set parallel.dp=2 --set parallel.ep=2
# A resume whose deck has other experts: refused, the checkpoint untouched.
mkdir -p bad_resume && cp -r ref/checkpoints bad_resume/
sum_before=$(md5sum bad_resume/checkpoints/*.h5)
rc=0
run_mpi 1 train "$DECK" "${common[@]}" --set run.dir=bad_resume --set model.experts=4 \
  >bad_resume.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "[model] experts, top_k, moe_every: the checkpoint holds a model of 8 experts" \
  bad_resume.log || { cat bad_resume.log; fail "resume with other experts: exit $rc"; }
[ "$(md5sum bad_resume/checkpoints/*.h5)" = "$sum_before" ] || fail "resume refusal changed the checkpoint"
echo "PASS: moe"
