#!/usr/bin/env bash
# A deck error fails the job once, with the message in the job log, and the
# job is not requeued.
source "$(dirname "$0")/lib.sh"
id=$(MPIFORMER_ARGS="--set train.lr=-1" RUN_DIR=run sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" FAILED COMPLETED || { show_job "$id"; fail "job did not end"; }
wait_job "$id" FAILED || { show_job "$id"; fail "a deck error should fail the job"; }
job_log "$id" | has -F "[train] lr: expected a value in" || { show_job "$id"; fail "no message in the job log"; }
[ "$(job_log "$id" | grep -c 'mpiformer: error')" -eq 1 ] || { show_job "$id"; fail "message not printed exactly once"; }
! job_log "$id" | has "requeuing" || fail "a failed job was requeued"
scontrol show job "$id" | has "Restarts=0" || { show_job "$id"; fail "job restarted"; }
echo "deck error: job $id failed once, not requeued"
