#!/usr/bin/env bash
# A run never prunes, and is never outranked by, checkpoints it did not
# write: a fresh run (resume = never) in a directory holding a longer earlier
# run moves the old files aside (nothing deleted), keeps its own, and a
# later resume continues it, not the old run. Root metadata is checksummed:
# an edited step is found by inspect and by resume, which falls back.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.eval_every=0 --set train.log_every=1 --set checkpoint.keep=2 --set run.dir=r)
ck=r/checkpoints
run_id_of() { sed -n 's/^run \(.*\)/\1/p' "$1"; }

run_mpi 1 train "$DECK" "${common[@]}" --set train.steps=6 --set checkpoint.every=2 >a.log 2>&1 ||
  { cat a.log; fail "run A failed"; }
old_id=$(run_id_of $ck/latest)
[ -n "$old_id" ] || { cat $ck/latest; fail "no run id in latest"; }
grep -q "^run:   $old_id (a new run)" a.log || fail "run A's id not in its log"

# Run B, fresh, in the same directory, shorter than A.
run_mpi 1 train "$DECK" "${common[@]}" --set train.steps=4 --set checkpoint.every=1 \
  --set checkpoint.resume=never >b.log 2>&1 || { cat b.log; fail "run B failed"; }
grep -q "checkpoint: moved 2 checkpoint(s) this run did not write" b.log || { cat b.log; fail "no set-aside"; }
new_id=$(run_id_of $ck/latest)
[ -n "$new_id" ] && [ "$new_id" != "$old_id" ] || fail "run B has run A's id ($new_id)"
[ "$(head -1 $ck/latest)" = step_00000004.h5 ] || { cat $ck/latest; fail "latest does not name B's last"; }
[ "$(cd $ck && ls step_*.h5 | tr '\n' ' ')" = "step_00000003.h5 step_00000004.h5 " ] ||
  { ls -R $ck; fail "B's own checkpoints were pruned, or A's were not moved"; }
aside=$(ls -d $ck/superseded-*)
[ "$(cd "$aside" && ls | tr '\n' ' ')" = "latest step_00000004.h5 step_00000006.h5 " ] ||
  { ls -R $ck; fail "run A's files were not kept aside"; }
"$MPIFORMER" inspect "$aside/step_00000006.h5" | has "run:         $old_id, root attributes verify" ||
  fail "A's checkpoint lost its id"
echo "ok: a fresh run set the old run's checkpoints aside and kept its own"

# Resume continues B, from B's step 4 (not A's 6).
run_mpi 1 train "$DECK" "${common[@]}" --set train.steps=5 >c.log 2>&1 || { cat c.log; fail "run C failed"; }
grep -q "resumed from $ck/step_00000004.h5: step 4" c.log || { cat c.log; fail "did not resume B"; }
grep -q "^run:   $new_id (resumed)" c.log || { cat c.log; fail "the resumed run changed its id"; }
[ "$(run_id_of $ck/latest)" = "$new_id" ] || fail "latest's run id changed on resume"
echo "ok: resume continues the new run"

# An edited step (here 5 -> 50) fails the root checksum: inspect says so,
# exit 2; resume = auto warns and falls back to step 4.
"$H5_DAMAGE" setint $ck/step_00000005.h5 step 50 || fail "could not edit the step"
rc=0
"$MPIFORMER" inspect $ck/step_00000005.h5 >i.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "step_00000005.h5: root attributes: checksum mismatch" i.log ||
  { cat i.log; fail "inspect of an edited step: exit $rc"; }
run_mpi 1 train "$DECK" "${common[@]}" --set train.steps=6 >d.log 2>&1 || { cat d.log; fail "run D failed"; }
grep -q "cannot resume from $ck/step_00000005.h5: .*root attributes: checksum mismatch" d.log &&
  grep -q "resumed from $ck/step_00000004.h5" d.log || { cat d.log; fail "no fallback past the edited step"; }
echo "ok: an edited step is found by its checksum and skipped"
