#!/usr/bin/env bash
# A step whose gradient norm is NaN (injected on one rank of a pp = 2 run,
# as a numerical or hardware fault would make it): under [train] nonfinite
# = "stop" every rank ends at that step with exit 2 and one message, nothing
# of the step is applied or saved, `latest` still names the last good
# checkpoint, metrics.jsonl stays valid JSON, and a resume from there runs
# on. Under "skip" the update is skipped, logged, and the run finishes with
# finite, verifying weights. Both again under ZeRO 1, 2 and 3.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
# shellcheck disable=SC2206  # SMALL_BATCH's words are the arguments
args=(--set train.steps=8 --set train.eval_every=0 --set checkpoint.every=2 --set parallel.pp=2 $SMALL_BATCH)

rc=0
MPIFORMER_FAULT_NONFINITE_STEP=5 run_mpi 2 train "$DECK" "${args[@]}" --set run.dir=stop \
  >stop.log 2>stop.err || rc=$?
[ "$rc" -eq 2 ] || { cat stop.log stop.err; fail "nonfinite stop: exit $rc, expected 2"; }
grep -qF "[train] nonfinite: step 5: grad norm nan" stop.err || { cat stop.err; fail "no message"; }
[ "$(grep -c 'mpiformer: error' stop.err)" -eq 1 ] || fail "the message should be printed once"
[ "$(head -1 stop/checkpoints/latest)" = step_00000004.h5 ] || fail "latest moved past the good step"
[ ! -e stop/checkpoints/step_00000005.h5 ] && [ ! -e stop/checkpoints/step_00000006.h5 ] ||
  fail "a checkpoint was written at or after the non-finite step"
python3 - stop/metrics.jsonl <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]  # strict: NaN is not JSON
last = [l for l in lines if "step" in l][-1]
assert last["step"] == 5 and last["grad_norm"] is None and "stopped" in last, last
PY
echo "ok: nonfinite = stop ends the run at the step, the last good checkpoint kept"

run_mpi 2 train "$DECK" "${args[@]}" --set run.dir=stop >resume.log 2>&1 ||
  { cat resume.log; fail "resume after a non-finite stop failed"; }
grep -q "resumed from .*step_00000004.h5" resume.log || { cat resume.log; fail "did not resume from step 4"; }
echo "ok: the run resumes from the last good checkpoint"

MPIFORMER_FAULT_NONFINITE_STEP=5 run_mpi 2 train "$DECK" "${args[@]}" --set run.dir=skip \
  --set train.nonfinite=skip >skip.log 2>&1 || { cat skip.log; fail "nonfinite = skip failed"; }
grep -q "step 5/8 .*update skipped (grad norm nan)" skip.log || { cat skip.log; fail "skip not logged"; }
python3 - skip/metrics.jsonl <<'PY'
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = {l["step"]: l for l in lines if "loss" in l}
assert steps[5]["skipped"] == "grad norm nan" and steps[5]["skipped_steps"] == 1, steps[5]
assert max(steps) == 8 and math.isfinite(steps[8]["loss"]), steps
PY
"$MPIFORMER" inspect skip/checkpoints/step_00000008.h5 | has "datasets verify" ||
  fail "the checkpoint after a skipped step does not verify"
echo "ok: nonfinite = skip skips the update and finishes"

# Under ZeRO the norm reads the shards (the hook poisons one of them): the
# same stop, at the step, and the same skip, at zero 1, 2 and 3 (dp 2).
for zero in 1 2 3; do
  rc=0
  MPIFORMER_FAULT_NONFINITE_STEP=5 run_mpi 2 train "$DECK" --set train.steps=8 $SMALL_BATCH \
    --set train.eval_every=0 --set checkpoint.every=2 --set parallel.dp=2 \
    --set parallel.zero=$zero --set run.dir=z${zero}_stop >z${zero}_stop.log 2>z${zero}_stop.err || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "[train] nonfinite: step 5: grad norm nan" z${zero}_stop.err ||
    { cat z${zero}_stop.err; fail "zero $zero: the non-finite step did not stop the run (exit $rc)"; }
  [ "$(head -1 z${zero}_stop/checkpoints/latest)" = step_00000004.h5 ] ||
    fail "zero $zero: latest moved past the good step"
  MPIFORMER_FAULT_NONFINITE_STEP=5 run_mpi 2 train "$DECK" --set train.steps=8 $SMALL_BATCH \
    --set train.eval_every=0 --set parallel.dp=2 --set parallel.zero=$zero \
    --set train.nonfinite=skip --set run.dir=z${zero}_skip >z${zero}_skip.log 2>&1 ||
    { cat z${zero}_skip.log; fail "zero $zero: nonfinite = skip failed"; }
  grep -q "step 5/8 .*update skipped (grad norm nan)" z${zero}_skip.log ||
    { cat z${zero}_skip.log; fail "zero $zero: skip not logged"; }
  "$MPIFORMER" inspect z${zero}_skip/checkpoints/step_00000008.h5 | has "datasets verify" ||
    fail "zero $zero: the checkpoint after a skipped step does not verify"
done
echo "ok: a non-finite step stops or is skipped at zero 1, 2 and 3"
