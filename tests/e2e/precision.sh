#!/usr/bin/env bash
# Mixed precision on the host back end (core/precision_plan.hpp):
#  1. The tiny deck trained 50 steps (a quarter of its schedule) at half
#     its batch (16 sequences), for the suite's time (fp32 and fp16 run on
#     the BLAS's sgemm, 10-13 s each on a CPU whose BLAS runs generic
#     kernels): the loss is 2.63, from 5.5. In bf16 and in fp16 it ends
#     within 0.03 nats of the fp32 run's final validation loss (seen: 0.0034
#     and 0.0004; at the deck's batch of 32, 0.002 and 0.0002, and about
#     0.001 after 100 steps, 0.003 after all 200).
#  2. Layouts agree with the one-rank run of the same precision: bit for bit
#     under full recomputation (the same ops on the same values), and within
#     a relative 1e-3 (bf16) or 1.25e-4 (fp16) for dp, pp, tp (with and
#     without sequence parallelism) and ZeRO, whose fp32 reductions group
#     sums differently. A float-level difference flips
#     the rounding of a few 16-bit activations or weight copies by one unit
#     (2^-8 relative in bf16, 2^-11 in fp16); over 6 steps that moved the
#     loss by at most 9e-5 (bf16) and 1.6e-5 (fp16), so each bound leaves
#     about 8x room, while a dropped micro-batch or a gradient averaged
#     instead of summed moves it by 1e-2 or more.
#  3. fp16's dynamic loss scaling: an overflow (injected as a NaN gradient
#     on one rank) is skipped on every rank, halves the scale, and does not
#     trip [train] nonfinite = "stop"; the scale grows after the window; a
#     scale that would fall below min_loss_scale ends the run (exit 2); a
#     fixed scale leaves the overflow to the nonfinite policy.
#  4. Resuming in the middle of a bf16 and of an fp16 run (the scaler's state
#     mid-window) continues bit for bit.
#  5. bf16 on a CPU without bf16 units (oneDNN held to AVX2) warns once and
#     gives the same numbers within the layouts' bound.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"

# ---- 1. 50 steps in each precision --------------------------------------
for p in fp32 bf16 fp16; do
  run_mpi 2 train "$DECK" --set parallel.dp=2 --set train.precision="\"$p\"" \
    --set train.steps=50 --set train.global_batch=16 --set train.micro_batch=8 \
    --set checkpoint.at_end=false --set run.dir="long_$p" >"long_$p.log" 2>&1 ||
    { cat "long_$p.log"; fail "50 steps in $p failed"; }
done
grep -q "device: cpu bf16 (oneDNN" long_bf16.log || { grep device: long_bf16.log; fail "bf16 not on oneDNN"; }
python3 - <<'PY'
import json
final = {}
for p in ("fp32", "bf16", "fp16"):
    evals = [j for j in map(json.loads, open(f"long_{p}/metrics.jsonl")) if "val_loss" in j]
    assert evals[-1]["step"] == 50, evals[-1]
    final[p] = evals[-1]["val_loss"]
for p in ("bf16", "fp16"):
    d = abs(final[p] - final["fp32"])
    assert d <= 0.03, f"{p}: final val loss {final[p]:.4f} vs fp32 {final['fp32']:.4f}"
    print(f"ok: {p} final val loss {final[p]:.4f}, fp32 {final['fp32']:.4f} (|diff| {d:.4f} <= 0.03)")
PY

# ---- 2. layouts against the one-rank run of the same precision ----------
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        --set checkpoint.at_end=false)
layout() {  # precision name ranks tolerance [args...]
  local p=$1 name=$2 np=$3 tol=$4
  shift 4
  run_mpi "$np" train "$DECK" "${common[@]}" --set train.precision="\"$p\"" \
    --set run.dir="lay_${p}_$name" "$@" >"lay_${p}_$name.log" 2>&1 ||
    { cat "lay_${p}_$name.log"; fail "$p $name failed"; }
  [ "$name" = one ] || compare "lay_${p}_one/metrics.jsonl" "lay_${p}_$name/metrics.jsonl" "$tol" "$p $name"
}
layout bf16 one 1 0
layout bf16 recompute 1 0 --set train.recompute=full
layout bf16 dp2_zero1 2 1e-3 --set parallel.dp=2 --set parallel.zero=1
layout bf16 pp2 2 1e-3 --set parallel.pp=2
layout bf16 tp2 2 1e-3 --set parallel.tp=2
layout bf16 tp2_sp 2 1e-3 --set parallel.tp=2 --set parallel.sequence_parallel=true
layout bf16 dp2_pp2_zero2 4 1e-3 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=2
# A CPU without bf16 units (oneDNN held to AVX2 here): said once at start,
# and the same numbers (other kernels, so other float summation orders).
ONEDNN_MAX_CPU_ISA=AVX2 run_mpi 1 train "$DECK" "${common[@]}" --set train.precision='"bf16"' \
  --set run.dir=lay_bf16_avx2 >lay_bf16_avx2.log 2>lay_bf16_avx2.err ||
  { cat lay_bf16_avx2.log lay_bf16_avx2.err; fail "bf16 without bf16 units failed"; }
[ "$(grep -c 'warning: precision "bf16": oneDNN .* WITHOUT bf16 units' lay_bf16_avx2.err)" -eq 1 ] ||
  { cat lay_bf16_avx2.err; fail "no single warning that the CPU has no bf16 units"; }
compare lay_bf16_one/metrics.jsonl lay_bf16_avx2/metrics.jsonl 1e-3 "bf16 without bf16 units"
layout fp16 one 1 0
layout fp16 recompute 1 0 --set train.recompute=attention
layout fp16 dp2_zero3 2 1.25e-4 --set parallel.dp=2 --set parallel.zero=3
layout fp16 pp2_gpipe 2 1.25e-4 --set parallel.pp=2 --set parallel.schedule=gpipe
layout fp16 tp2 2 1.25e-4 --set parallel.tp=2
layout fp16 tp2_sp 2 1.25e-4 --set parallel.tp=2 --set parallel.sequence_parallel=true

# ---- 3 and 4. the loss scaler, and resuming mid-run ---------------------
# shellcheck disable=SC2206  # SMALL_BATCH's words are the arguments
seg=(--set train.steps=10 --set train.log_every=1 --set train.eval_every=0
     --set checkpoint.every=5 $SMALL_BATCH)
scaled=(--set train.precision='"fp16"' --set train.loss_scale_window=3)
# Whole: an overflow at step 4 on rank 0 only, under nonfinite = "stop".
MPIFORMER_FAULT_NONFINITE_STEP=4 run_mpi 2 train "$DECK" "${seg[@]}" "${scaled[@]}" \
  --set parallel.dp=2 --set run.dir=fp16_whole >fp16_whole.log 2>&1 ||
  { cat fp16_whole.log; fail "an fp16 overflow ended the run"; }
grep -q "step  4/10 .*update skipped (fp16 overflow: loss scale 131072 -> 65536)" fp16_whole.log ||
  { grep "^step" fp16_whole.log; fail "the overflow was not skipped and logged"; }
python3 - fp16_whole/metrics.jsonl <<'PY'
import json, sys
steps = {j["step"]: j for j in map(json.loads, open(sys.argv[1])) if "loss" in j}
scales = [steps[s]["loss_scale"] for s in range(1, 11)]
# GradScaler's rule by hand: grow after 3 clean steps, halve at step 4.
want = [65536, 65536, 65536, 131072, 65536, 65536, 65536, 131072, 131072, 131072]
assert scales == want, scales
assert [s for s in steps if steps[s]["overflow"]] == [4], steps
assert steps[10]["overflows"] == 1 and "skipped_steps" not in steps[10], steps[10]
PY
echo "ok: an fp16 overflow is skipped on every rank, backs the scale off, and is no fault"
# The same run in two segments: stop after step 5 (scale 65536, one clean
# step into its window), then resume.
MPIFORMER_FAULT_NONFINITE_STEP=4 run_mpi 2 train "$DECK" "${seg[@]}" "${scaled[@]}" \
  --set parallel.dp=2 --set train.stop_at=5 --set run.dir=fp16_split >fp16_a.log 2>&1 ||
  { cat fp16_a.log; fail "first segment failed"; }
run_mpi 2 train "$DECK" "${seg[@]}" "${scaled[@]}" --set parallel.dp=2 \
  --set run.dir=fp16_split >fp16_b.log 2>&1 || { cat fp16_b.log; fail "resume failed"; }
grep -q "resumed from .*step_00000005.h5" fp16_b.log || fail "fp16: did not resume from step 5"
compare fp16_whole/metrics.jsonl fp16_split/metrics.jsonl 0 "fp16 resumed at step 5"
python3 - fp16_whole/metrics.jsonl fp16_split/metrics.jsonl <<'PY'
import json, sys
a, b = ({j["step"]: j["loss_scale"] for j in map(json.loads, open(f)) if "loss" in j} for f in sys.argv[1:])
assert a == b, (a, b)
PY
run_mpi 1 train "$DECK" "${seg[@]}" --set train.precision='"bf16"' --set run.dir=bf16_whole \
  >bf16_whole.log 2>&1 || { cat bf16_whole.log; fail "bf16 run failed"; }
run_mpi 1 train "$DECK" "${seg[@]}" --set train.precision='"bf16"' --set train.stop_at=5 \
  --set run.dir=bf16_split >bf16_a.log 2>&1 || { cat bf16_a.log; fail "bf16 first segment failed"; }
run_mpi 1 train "$DECK" "${seg[@]}" --set train.precision='"bf16"' --set run.dir=bf16_split \
  >bf16_b.log 2>&1 || { cat bf16_b.log; fail "bf16 resume failed"; }
compare bf16_whole/metrics.jsonl bf16_split/metrics.jsonl 0 "bf16 resumed at step 5"

# Below the minimum: the first backoff would pass it.
rc=0
MPIFORMER_FAULT_NONFINITE_STEP=2 run_mpi 2 train "$DECK" "${seg[@]}" "${scaled[@]}" \
  --set parallel.dp=2 --set train.min_loss_scale=65536 --set run.dir=fp16_min \
  >fp16_min.log 2>fp16_min.err || rc=$?
[ "$rc" -eq 2 ] || { cat fp16_min.log fp16_min.err; fail "below min_loss_scale: exit $rc, expected 2"; }
grep -qF "[train] min_loss_scale: step 2:" fp16_min.err || { cat fp16_min.err; fail "no message naming the key"; }
[ "$(grep -c 'mpiformer: error' fp16_min.err)" -eq 1 ] || fail "the message should be printed once"
echo "ok: a scale that would fall below min_loss_scale ends the run"
# A fixed scale: the overflow is the nonfinite policy's.
rc=0
MPIFORMER_FAULT_NONFINITE_STEP=2 run_mpi 2 train "$DECK" "${seg[@]}" --set train.precision='"fp16"' \
  --set train.loss_scale=1 --set parallel.dp=2 --set run.dir=fp16_fixed \
  >fp16_fixed.log 2>fp16_fixed.err || rc=$?
[ "$rc" -eq 2 ] && grep -qF "[train] nonfinite: step 2: grad norm nan" fp16_fixed.err ||
  { cat fp16_fixed.err; fail "a fixed scale's overflow did not reach the nonfinite policy (exit $rc)"; }
# The message blames the likely cause, the fixed scale, not the learning rate.
grep -qF "the likely cause is the fixed [train] loss_scale = 1" fp16_fixed.err ||
  { cat fp16_fixed.err; fail "the message does not name the fixed loss scale"; }
echo "ok: with a fixed loss scale the nonfinite policy still stops the run, naming the scale"
