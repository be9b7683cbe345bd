#!/usr/bin/env bash
# The Llama family (inputs/llama-tiny.toml: RMSNorm, rotary positions,
# SwiGLU, 2 kv heads for 4 query heads, an untied head) on every parallel
# axis against its one-rank run: data, pipeline (zb-h1; 1F1B in the resume),
# tensor (kv heads and SwiGLU's gate and up split over the group, with and
# without sequence parallelism; kv heads fewer than the tensor ranks, each
# shared by neighbouring ranks that sum its gradients, under ZeRO 0 and
# 3), ZeRO 1-3 and recomputation (and bf16 with
# offload bit for bit against bf16 without): loss, grad
# norm and validation loss of every step within 1e-5 relative, and every
# final tensor within 1e-5 in norm (compare_checkpoints.py: h5dump, no
# mpiformer code). Why 1e-5: as for GPT-2 (layout_equivalence.sh,
# tensor_parallel.sh) only fp32 summation order differs (~1e-7 seen); a
# kv head read by the wrong query heads, a rotation at the wrong position
# on a later stage, a gate slice paired with another rank's up slice, or
# an untied head's gradient summed with the embedding's moves the loss by
# 1e-3 or more. Then: a tied Llama over two stages (its copies kept equal),
# a resume under another layout, inspect and generate on the checkpoint,
# and the family's deck errors (exit 2, one message naming the key).
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/llama-tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        $STEADY_ADAMW)
train() { train_layout "$@"; }  # dir dp pp tp [extra...] (lib.sh)
same() { same_run "$@"; }  # ref dir label (lib.sh)

train ref 1 1 1
# dp pp tp schedule recompute zero sequence_parallel
# Each axis once, with the Llama-specific paths: split backward (zb-h1:
# SwiGLU's and RoPE's gradients kept for W), sequence parallelism (rows
# rotated after the gather), ZeRO 3's windows and full recomputation, tp
# with ZeRO 3 (q, k, v and gate, up parts sharded). The schedules'
# machinery itself (1F1B, interleaving) is the family's no more than
# GPT-2's, tested by layout_equivalence.sh; the resume below runs 1F1B on
# two stages.
cases=("1 2 1 zb-h1 attention 1 false" "1 1 2 gpipe attention 2 true"
       "2 1 1 1f1b full 3 false" "2 1 2 1f1b none 3 false")
for c in "${cases[@]}"; do
  set -- $c
  dir="l_$1_$2_$3_$4_$5_$6_$7"
  chunks=1
  [ "$4" = interleaved ] && chunks=2
  train "$dir" "$1" "$2" "$3" --set parallel.schedule="$4" --set train.recompute="$5" \
    --set parallel.zero="$6" --set parallel.sequence_parallel="$7" \
    --set parallel.virtual_stages="$chunks"
  same ref "$dir" "llama (dp $1, pp $2, tp $3) $4, recompute $5, zero $6, sequence parallel $7"
done

# Interleaving with chunks of unequal length (6 layers into 2 x 2 chunks:
# the first and the last one short) with the untied head on the short
# last chunk, under tensor and sequence parallelism.
train u_ref 1 1 1 --set model.n_layer=6
train u_il 1 2 2 --set model.n_layer=6 --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2 --set parallel.sequence_parallel=true
grep -q "stage 0 holds layers \[0, 1) and \[3, 5)" u_il.log || fail "6 layers: not cut 1 + 2"
same u_ref u_il "llama (dp 1, pp 2, tp 2) interleaved 6 layers, chunks of unequal length"

# kv heads fewer than the tensor ranks: tp 4 over the deck's 2 (each
# shared by two ranks, zero 0's whole gradients), and multi-query (one kv
# head) over tp 2 with ZeRO 3 and sequence parallelism (the sharers' owned
# rows of it summed after the reduce-scatter). A kv head's gradient taken
# from one rank's query heads only, or summed twice, moves the loss by
# 1e-3 or more; its copies must stay equal, and be written once.
train shared_4 1 1 4
same ref shared_4 "llama (dp 1, pp 1, tp 4), kv heads shared by 2 ranks"
grep -q "model: each kv head shared by 2 tensor ranks (tp 4 > 2 kv heads)" shared_4.log ||
  fail "tp 4: the sharing is not logged"
grep -q "tensor groups: every rank's replicated tensors match its group's (.*; the kv heads' rows of 4 on the ranks sharing them)" \
  shared_4.log || { grep "tensor groups" shared_4.log; fail "tp 4: shared kv rows not confirmed identical"; }
train mq_ref 1 1 1 --set model.n_kv_head=1
train mq_2_1_2 2 1 2 --set model.n_kv_head=1 --set parallel.zero=3 --set parallel.sequence_parallel=true
same mq_ref mq_2_1_2 "multi-query llama (dp 2, pp 1, tp 2) zero 3, sequence parallel"

# bf16 with its masters and moments offloaded to files: bit for bit the
# run without offload (the same element arithmetic, e2e.offload's bound).
mkdir -p offload
train bf16_none 2 1 1 --set train.precision=bf16
train bf16_nvme 2 1 1 --set train.precision=bf16 --set train.offload=nvme --set train.offload_dir=offload
compare bf16_none/metrics.jsonl bf16_nvme/metrics.jsonl 0 "llama bf16 offload nvme against none"

# Tied: the embedding is the head on both ends of the pipeline.
train tied_ref 1 1 1 --set model.tie_embeddings=true
train tied_pp 1 2 1 --set model.tie_embeddings=true
grep -q "tied embedding: first and last stage copies are identical" tied_pp.log ||
  fail "tied llama: copies not confirmed identical"
same tied_ref tied_pp "tied llama (pp 2)"

# Resume under another layout: (1,2,1) 1F1B stopped at step 3 -> (1,1,4),
# whose kv heads are shared; and out of that layout's checkpoint into one
# rank.
resume_run seg "1 2 1" resumed "1 1 4"
same ref resumed "llama resumed (1,2,1) -> (1,1,4)"
resume_run seg4 "1 1 4" resumed1 "1 1 1"
same ref resumed1 "llama resumed (1,1,4) -> (1,1,1)"

# inspect names the family; generate continues a prompt from the KV cache.
"$MPIFORMER" inspect ref/checkpoints/step_00000006.h5 >inspect.txt
grep -q "family:      llama: 2 kv heads, ffn_hidden 352, rope_theta 10000, norm_eps 1e-05, untied head" \
  inspect.txt || { cat inspect.txt; fail "inspect does not name the family"; }
grep -q "checksums:   all" inspect.txt || fail "inspect: checksums"
generates ref/checkpoints/step_00000006.h5

# Export: one file and shards; the numpy forward over the shards.
need_numpy
ck=ref/checkpoints/step_00000006.h5
"$MPIFORMER" export "$ck" --format hf --output hf_one >export.log || { cat export.log; fail "export"; }
"$MPIFORMER" export "$ck" --format hf --max-shard-mb 0.5 --output hf_shards >>export.log ||
  { cat export.log; fail "export in shards"; }
grep -q "as a Hugging Face LlamaForCausalLM directory" export.log || fail "export: not named Llama"
shards=(hf_shards/model-*-of-*.safetensors)
[ -e hf_shards/model.safetensors.index.json ] && [ "${#shards[@]}" -ge 2 ] && [ ! -e hf_shards/model.safetensors ] ||
  { ls hf_shards; fail "export: no shards"; }
"$PY" "$SOURCE_DIR/tests/e2e/llama_numpy.py" hf hf_one
"$PY" "$SOURCE_DIR/tests/e2e/llama_numpy.py" hf hf_shards
numpy_logits "$ck" hf_shards
rc=0
"$MPIFORMER" export "$ck" --format llmc --output m.bin >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "llm.c's parameter file holds GPT-2 only" err.txt && [ ! -e m.bin ] ||
  { cat err.txt; fail "llmc export of a Llama model not refused (exit $rc)"; }

# init from the export: shards read slice by slice under (1,2,2) give the
# first steps of init from the checkpoint itself on one rank.
train init_ck 1 1 1 --set model.init="$ck" --set train.steps=2 --set train.eval_every=0
train init_hf 1 2 2 --set model.init=hf_shards --set train.steps=2 --set train.eval_every=0
grep -q "init: weights from hf_shards/model.safetensors.index.json (Hugging Face" init_hf.log ||
  fail "init from the shards: no init line"
compare init_ck/metrics.jsonl init_hf/metrics.jsonl 1e-5 "llama init from Hugging Face shards"
"$MPIFORMER" export "$ck" --format hf --dtype bf16 --output hf_bf16 >>export.log
train init_bf16 1 1 1 --set model.init=hf_bf16 --set train.steps=2 --set train.eval_every=0

# Bad Llama directories: refused before anything is written.
# One rank each: that every rank exits with the message is bad_input.sh's.
bad_init() {  # label expected-text dir [--set ...]
  local label=$1 want=$2 dir=$3 rc=0
  shift 3
  run_mpi 1 train "$DECK" "${common[@]}" --set model.init="$dir" \
    --set run.dir="badinit_$label" "$@" >"badinit_$label.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "badinit_$label.log"; fail "init $label: exit $rc, expected 2"; }
  grep -qF "$want" "badinit_$label.log" || { cat "badinit_$label.log"; fail "init $label: message"; }
  ! compgen -G "badinit_$label/checkpoints/step_*.h5" >/dev/null || fail "init $label: wrote a checkpoint"
  echo "ok: init $label refused"
}
bad_init kv "[model] n_kv_head: 4, but [model] init's hf_one/model.safetensors holds 2" hf_one \
  --set model.n_kv_head=4
DECK="$SOURCE_DIR/inputs/tiny.toml" bad_init family \
  "[model] family: \"gpt2\", but [model] init's hf_one/model.safetensors holds a llama model" hf_one
lost=$(basename "${shards[1]}")
cp -r hf_shards hf_lost && rm "hf_lost/$lost"
bad_init lost_shard "names $lost, which does not exist" hf_lost
# One tensor fewer, and one more, than the model has (rewritten by python).
"$PY" - hf_one <<'PY'
import json, os, shutil, struct, sys
src = sys.argv[1]
data = open(f"{src}/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header, body = json.loads(data[8:8 + n]), data[8 + n:]
def write(dst, entries):
    os.makedirs(dst)
    shutil.copy(f"{src}/config.json", dst)
    out, raw, at = {}, b"", 0
    for name, e in entries:
        b, end = e["data_offsets"]
        out[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [at, at + end - b]}
        raw += body[b:end]
        at += end - b
    h = json.dumps(out).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(f"{dst}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw)
items = [(k, v) for k, v in header.items() if k != "__metadata__"]
write("hf_missing", [(k, v) for k, v in items if k != "model.layers.1.mlp.up_proj.weight"])
write("hf_extra", items + [("model.layers.9.mlp.up_proj.weight", header["model.norm.weight"])])
PY
bad_init missing "model.layers.1.mlp.up_proj.weight: missing" hf_missing
bad_init extra "model.layers.9.mlp.up_proj.weight: a tensor this Llama model does not have (extra)" hf_extra

# The family's deck errors.
expect_error() {  # label expected-text --set ...
  local label=$1 want=$2 rc=0
  shift 2
  run_mpi 1 train "$DECK" "${common[@]}" --set run.dir="bad_$label" "$@" \
    >"bad_$label.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "bad_$label.log"; fail "$label: exit $rc, expected 2"; }
  grep -qF "$want" "bad_$label.log" || { cat "bad_$label.log"; fail "$label: message"; }
  ! compgen -G "bad_$label/checkpoints/step_*.h5" >/dev/null || fail "$label: wrote a checkpoint"
  echo "ok: $label refused"
}
expect_error kv_heads "[model] n_kv_head: must divide [model] n_head (4)" --set model.n_kv_head=3
expect_error tp_kv "[parallel] tp, [model] n_kv_head: one of tp 2 and n_kv_head 3 must divide the other" \
  --set parallel.tp=2 --set model.n_embd=96 --set model.n_head=6 --set model.n_kv_head=3
expect_error gpt2_key "[model] n_kv_head: applies to [model] family = \"llama\" only" \
  --set model.family=gpt2
expect_error rope_odd "must be even (rotary positions" --set model.n_embd=120 --set model.n_head=8 \
  --set model.n_kv_head=2 --set model.ffn_hidden=320
echo "ok: llama"
