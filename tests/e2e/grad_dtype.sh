#!/usr/bin/env bash
# [train] grad_dtype = bf16 (train/zero_shards.hpp) in whole runs of the
# tiny deck, bf16 precision, dp 2 x pp 2 with 4 micro-batches a step.
# (1) Against float gradients on the same layout, at zero 1, 2 and 3:
#     loss, gradient norm and validation loss of every step within 1e-3
#     relative. Why: each micro-batch's block gradients are rounded to
#     bf16 (2^-9 of each value) once per micro-batch (zero 1: into the
#     step's sum; zero 2-3: before the reduce-scatter) and once per
#     reduction step; the float masters and moments take the rest.
#     Measured at most 1.8e-4 over 6 steps (the vocabulary's too, from
#     8.1e-5 with its float gradients). A micro-batch's gradients
#     dropped from the sum moves the norm by a quarter or more; a block not
#     reduced, by a factor near sqrt(2).
# (2) What each rank sends a step (dp_sent_mb, the run's own count): the
#     blocks' reduce-scatters in 2 bytes instead of 4, the weights' gathers
#     (bf16 either way) unchanged: between 0.5 and 0.8 of float's.
# (3) Refused, exit 2 naming [train] grad_dtype: with precision fp32, with
#     zero 0.
# (4) Zero 1 on one stage (dp 4, pp 1) at n_embd 16, where the vocabulary
#     (256 x 16, larger than a block) goes through the windows in two row
#     pieces and its 16-bit sums hold both the head's and the embedding's
#     gradients of the tied wte, reduced in place once, after the
#     embedding's: against float gradients to 1e-3, as (1) (4.1e-4 seen:
#     the wte's sums over the step in 16 bits). Reduced after the head's
#     as well (tried), the step's gradient norm moves by 4.6%.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=2 --set train.eval_batches=1
        --set train.precision=bf16 --set parallel.dp=2 --set parallel.pp=2
        --set checkpoint.at_end=false)

train() {  # dir zero grad_dtype [extra...]
  local dir=$1 zero=$2 g=$3
  shift 3
  run_mpi 4 train "$DECK" "${common[@]}" --set parallel.zero="$zero" \
    --set train.grad_dtype="$g" --set run.dir="$dir" "$@" >>"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "$dir failed"; }
}

for zero in 1 2 3; do
  train "fp32_$zero" "$zero" fp32
  train "bf16_$zero" "$zero" bf16
  compare "fp32_$zero/metrics.jsonl" "bf16_$zero/metrics.jsonl" 1e-3 "zero $zero, bf16 gradients against float"
  python3 - "$(mean_sent_mb "bf16_$zero/metrics.jsonl")" "$(mean_sent_mb "fp32_$zero/metrics.jsonl")" "$zero" <<'PY' ||
import sys
got, base, zero = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
r = got / base
print(f"zero {zero}: {got:.3f} MB sent a step per rank with bf16 gradients, {r:.3f} of float's")
assert 0.5 < r < 0.8, r
PY
    fail "zero $zero: bytes sent"
done

# (4) The tied vocabulary in 16-bit sums on one stage, in pieces.
one_stage=(--set parallel.dp=4 --set parallel.pp=1 --set model.n_embd=16 --set model.n_head=2)
train fp32_one 1 fp32 "${one_stage[@]}"
train bf16_one 1 bf16 "${one_stage[@]}"
grep -q "the vocabulary's gradients through the windows in 2 pieces" bf16_one.log ||
  { cat bf16_one.log; fail "zero 1, bf16 gradients: the vocabulary is not in pieces"; }
compare fp32_one/metrics.jsonl bf16_one/metrics.jsonl 1e-3 \
  "zero 1 on one stage, the tied vocabulary in 16 bits"

# (3) Refusals.
for bad in "--set train.precision=fp32" "--set parallel.zero=0"; do
  set +e
  # shellcheck disable=SC2086
  run_mpi 4 train "$DECK" "${common[@]}" --set train.grad_dtype=bf16 $bad --set run.dir=refused \
    >refused.log 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || { cat refused.log; fail "$bad with bf16 gradients: exit $rc, not 2"; }
  has "\[train\] grad_dtype" refused.log || { cat refused.log; fail "$bad: key not named"; }
done
echo "e2e.grad_dtype: passed"
