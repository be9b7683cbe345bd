#!/usr/bin/env bash
# sbatch of the tiny deck on 2 ranks completes and its log ends with the
# final validation loss.
source "$(dirname "$0")/lib.sh"
id=$(MPIFORMER_ARGS="$SMALL --set parallel.dp=2 --set train.steps=20 --set train.eval_every=0" \
     RUN_DIR=run sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" COMPLETED FAILED CANCELLED || { show_job "$id"; fail "job did not end"; }
wait_job "$id" COMPLETED || { show_job "$id"; fail "job did not complete"; }
job_log "$id" | has "srun --mpi=pmix" || { show_job "$id"; fail "not launched with srun --mpi=pmix"; }
job_log "$id" | has -E "^final val loss [0-9.]+ after 20 steps" || { show_job "$id"; fail "no final val loss"; }
job_log "$id" | has "restart count 0" || fail "restart count not logged"
echo "job $id completed: $(job_log "$id" | grep 'final val loss')"
