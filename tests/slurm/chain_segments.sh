#!/usr/bin/env bash
# jobs/chain.sh submits 3 segments chained with afterany; together they
# complete the run, each resuming where the previous stopped.
source "$(dirname "$0")/lib.sh"
ids=$(cd "$SOURCE_DIR" && SEGMENTS=3 STEPS_PER_SEGMENT=4 RUN_DIR="$WORK/run" DECK="$DECK" \
      MPIFORMER="$MPIFORMER" SBATCH_ARGS="-n 1 --chdir=$WORK" \
      MPIFORMER_ARGS="$SMALL --set train.steps=12 --set train.eval_every=0" jobs/chain.sh)
set -- $ids
[ $# -eq 3 ] || fail "expected 3 job ids, got: $ids"
for id in "$@"; do
  wait_job "$id" COMPLETED || { show_job "$id"; fail "segment $id did not complete"; }
done
job_log "$2" | has "resumed from $WORK/run/checkpoints/step_00000004.h5: step 4" || { show_job "$2"; fail "segment 2 did not resume at 4"; }
job_log "$3" | has "resumed from $WORK/run/checkpoints/step_00000008.h5: step 8" || { show_job "$3"; fail "segment 3 did not resume at 8"; }
job_log "$3" | has -E "^final val loss [0-9.]+ after 12 steps" || { show_job "$3"; fail "run not completed"; }
[ "$(grep -c '"loss"' run/metrics.jsonl)" -eq 12 ] || fail "expected 12 step lines over the 3 segments"
echo "chain of 3 segments completed the run"
