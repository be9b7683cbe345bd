#!/usr/bin/env bash
# A checkpoint counts only once it reads back, whatever touches the run's
# files (MPIFORMER_FAULT_* hooks, src/core/test_hooks.hpp, do to them what
# an outside process would). Two ranks, offload = "nvme", a checkpoint
# every 2 steps, keep = 1 (so pruning would lose the last good one at once):
# (1) a checkpoint changed on disk after it is written: kept as
#     .unverified, not published, nothing older pruned, exit 74, and
#     resume = "auto" continues from the last good one to the straight
#     run's numbers exactly; likewise when it is read back beside
#     training ([checkpoint] read_back = "background");
# (2) the offload file replaced under the run (a scratch cleaner, a
#     second job): the save reads the run's own open file, so the
#     checkpoint is right (its tensors those of the straight run at that
#     step), is published, and the run stops with exit 75 naming the file;
#     the requeued run resumes from it and finishes exactly;
# (3) the file removed: the same;
# (4) the file cut before a save: nothing is written, exit 75, the last
#     good checkpoint is latest, and the resume finishes exactly;
# (5) the file cut while the save has it mapped: no bus error, exit 75
#     naming the file, the last good checkpoint still latest.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=0
        --set train.global_batch=8 --set train.micro_batch=4 --set parallel.dp=2
        --set train.offload=nvme --set train.offload_dir=scratch
        --set train.offload_block_mb=0.02 --set checkpoint.every=2 --set checkpoint.keep=1)
mkdir -p scratch

train() {  # dir expected-rc [env...] -- [extra...]
  local dir=$1 want=$2
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  local rc=0
  env "${envs[@]}" mpirun -np 2 "$MPIFORMER" train "$DECK" "${common[@]}" \
    --set run.peak_tflops=1 --set run.dir="$dir" "$@" >"$dir.log" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$dir.log"; fail "$dir: exit $rc, expected $want"; }
}
ckpt() { echo "$1/checkpoints/step_$(printf %08d "$2").h5"; }
latest_step() { sed -n 's/.*step_0*\([0-9][0-9]*\)\.h5.*/\1/p' "$1/checkpoints/latest"; }
same_tensors() {  # a.h5 b.h5 label
  for g in /model /optim; do
    h5diff "$1" "$2" "$g" "$g" >/dev/null || fail "$3: tensors under $g differ"
  done
}
train straight 0
grep -q "read back and verified" straight.log || fail "the save does not say it verified"

# (1) A checkpoint that does not read back.
train corrupt 74 MPIFORMER_FAULT_CORRUPT_CHECKPOINT=4
grep -q "did not read back as written" corrupt.log || { cat corrupt.log; fail "(1) no message"; }
[ -f "$(ckpt corrupt 4).unverified" ] || fail "(1) the bad checkpoint was not kept aside"
[ ! -e "$(ckpt corrupt 4)" ] || fail "(1) the bad checkpoint has its name"
[ "$(latest_step corrupt)" = 2 ] || fail "(1) latest moved past the last good checkpoint"
[ -f "$(ckpt corrupt 2)" ] || fail "(1) the last good checkpoint was pruned"
[ ! -f corrupt/finished ] || fail "(1) the run says it finished"
"$MPIFORMER" inspect "$(ckpt corrupt 2)" >/dev/null || fail "(1) the last good checkpoint does not verify"
train corrupt 0  # resume = "auto": from step 2
same_tensors "$(ckpt corrupt 6)" "$(ckpt straight 6)" "(1) resumed"
echo "ok (1): a checkpoint that does not read back is kept aside, nothing lost"

# (1b) [checkpoint] read_back = "background": training goes on while the
# read-back runs; latest moves only once it matches. Clean: the straight
# run's losses and tensors, every save said to be read back beside
# training and published, the last one read back inline. Damaged at step
# 4: found beside training, kept aside as in (1), exit 74, latest at 2.
behind=(--set checkpoint.read_back='"background"')
train behind 0 -- "${behind[@]}"
[ "$(last_losses behind/metrics.jsonl)" = "$(last_losses straight/metrics.jsonl)" ] || fail "(1b) losses"
same_tensors "$(ckpt behind 6)" "$(ckpt straight 6)" "(1b)"
for s in 2 4; do
  grep -q "checkpoint: wrote $(ckpt behind $s) (.*); read back beside training, published once it matches" \
    behind.log || { cat behind.log; fail "(1b) step $s was not written for a read-back beside training"; }
  grep -q "checkpoint: read back and verified $(ckpt behind $s) beside training (.*); published" behind.log ||
    { cat behind.log; fail "(1b) step $s was not published after its read-back"; }
done
grep -q "checkpoint: wrote $(ckpt behind 6) (.*read back and verified in" behind.log ||
  { cat behind.log; fail "(1b) the last save was not read back inline"; }
[ "$(grep -c '"checkpoint_saved"' behind/metrics.jsonl)" -eq 3 ] || fail "(1b) checkpoint_saved records"
train behind_bad 74 MPIFORMER_FAULT_CORRUPT_CHECKPOINT=4 -- "${behind[@]}"
grep -q "did not read back as written" behind_bad.log || { cat behind_bad.log; fail "(1b) no message"; }
[ -f "$(ckpt behind_bad 4).unverified" ] || fail "(1b) the bad checkpoint was not kept aside"
[ "$(latest_step behind_bad)" = 2 ] || fail "(1b) latest moved past the last good checkpoint"
[ -f "$(ckpt behind_bad 2)" ] || fail "(1b) the last good checkpoint was pruned"
echo "ok (1b): read back beside training: the same checkpoints, a bad one found and kept aside"

# (2), (3) The offload file replaced or removed under the run.
for action in replace remove; do
  train "$action" 75 MPIFORMER_FAULT_OFFLOAD_TAMPER=4:$action
  grep -q "mpiformer-offload.rank0.adam_m was $( [ $action = replace ] && echo replaced || echo removed)" \
    "$action.log" || { cat "$action.log"; fail "($action) the file is not named"; }
  [ "$(latest_step "$action")" = 4 ] || fail "($action) the checkpoint of step 4 is not latest"
  "$MPIFORMER" inspect "$(ckpt "$action" 4)" >/dev/null || fail "($action) step 4 does not verify"
  # The straight run's step 4, kept apart (keep = 1 pruned it there).
  [ -f straight4.h5 ] || { train straight4 0 -- --set train.steps=4 && cp "$(ckpt straight4 4)" straight4.h5; }
  same_tensors "$(ckpt "$action" 4)" straight4.h5 "($action) step 4"
  rm -f scratch/*.other
  train "$action" 0
  same_tensors "$(ckpt "$action" 6)" "$(ckpt straight 6)" "($action) resumed"
  echo "ok: the offload file ${action}d under the run: a right checkpoint, exit 75, resumed exactly"
done

# (4) The file cut before a save: the state is lost, nothing is written.
train cut 75 MPIFORMER_FAULT_OFFLOAD_TAMPER=4:cut
grep -q "was cut to 0 bytes under the run" cut.log || { cat cut.log; fail "(4) no message"; }
grep -q "the checkpoint of step 4 was not written" cut.log || fail "(4) the message does not say so"
[ "$(latest_step cut)" = 2 ] || fail "(4) latest is not the last good checkpoint"
[ ! -e "$(ckpt cut 4)" ] || fail "(4) a checkpoint of the lost state was written"
train cut 0
same_tensors "$(ckpt cut 6)" "$(ckpt straight 6)" "(4) resumed"
echo "ok (4): the file cut before a save: nothing written, exit 75, resumed exactly"

# (5) Cut while the save has it mapped: a named exit 75, not a bus error.
train cutsave 75 MPIFORMER_FAULT_OFFLOAD_TAMPER=4:cut-in-save
grep -q "was cut short while the run had it mapped" cutsave.log ||
  { cat cutsave.log; fail "(5) no message naming the file"; }
grep -q "mpiformer-offload.rank0" cutsave.log || fail "(5) the file is not named"
[ "$(latest_step cutsave)" = 2 ] || fail "(5) latest is not the last good checkpoint"
[ ! -e "$(ckpt cutsave 4)" ] || fail "(5) a checkpoint of the lost state was published"
echo "ok (5): the file cut during a save: exit 75 naming it, the last good checkpoint latest"
