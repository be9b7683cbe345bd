#!/usr/bin/env bash
# Under the real Slurm: a rank SIGKILLed mid-run is restarted inside the
# allocation (after a health check of its nodes) and the job COMPLETES with
# the uninterrupted run's losses; a launch that fails, or a restart with no
# healthy node left, ends the job FAILED with the reason after at most
# MAX_FAILURE_RESTARTS restarts.
source "$(dirname "$0")/lib.sh"
export RESTART_BACKOFF_S=1
args="$SMALL --set parallel.dp=2 --set train.steps=40 --set train.eval_every=20 --set checkpoint.every=8"
wait_steps() {  # wait_steps METRICS N
  for _ in $(seq 1 240); do
    [ "$(grep -c '"loss"' "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0
    sleep 0.25
  done
  return 1
}

# 1. A rank killed after the checkpoint at step 8.
# NCCL_DEBUG set at submission reaches the ranks (sbatch and srun export
# the environment) and is recorded on the first line of metrics.jsonl.
id=$(NCCL_DEBUG=INFO MPIFORMER_ARGS="$args" RUN_DIR=killed sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" RUNNING || { show_job "$id"; fail "job did not start"; }
wait_steps killed/metrics.jsonl 11 || { show_job "$id"; fail "the run did not reach step 11"; }
kill -KILL "$(ranks_here | tail -1)"  # this test's ranks, never another test's
wait_job "$id" COMPLETED FAILED || { show_job "$id"; fail "job did not end"; }
job_state "$id" COMPLETED || { show_job "$id"; fail "the job did not recover from a killed rank"; }
for want in "failure restart 1 of at most 3 (1 in this run directory) after: " \
            "healthy nodes: localhost (1 of 1; MIN_NODES 1)" "resumed from killed/checkpoints/step_" \
            "launch ended: finished step 40 of 40" "run finished: finished step 40 of 40"; do
  job_log "$id" | has -F "$want" || { show_job "$id"; fail "no '$want' in the job log"; }
done
scontrol show job "$id" | has "Restarts=0" || { show_job "$id"; fail "recovered by a requeue, not inside the allocation"; }
head -1 killed/metrics.jsonl | has -F '"NCCL_DEBUG": "INFO"' || { head -1 killed/metrics.jsonl; fail "NCCL_DEBUG not recorded"; }
run_mpi 2 train "$DECK" $args --set run.dir=straight >straight.log 2>&1 || { cat straight.log; fail "uninterrupted run failed"; }
# 1e-5 relative, the issue's bound for an exact resume (bitwise here: same layout).
same_losses killed/metrics.jsonl straight/metrics.jsonl 40 1e-5 "restarted in the allocation"

# 2. A launch that fails every time (srun cannot create the step: more CPUs
# per task than the allocation has): FAILED after MAX_FAILURE_RESTARTS=1.
id=$(MAX_FAILURE_RESTARTS=1 LAUNCHER_ARGS="--cpus-per-task=64" MPIFORMER_ARGS="$args" RUN_DIR=nolaunch \
     sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" FAILED COMPLETED || { show_job "$id"; fail "job did not end"; }
job_state "$id" FAILED || { show_job "$id"; fail "a launch that always fails must end FAILED"; }
[ "$(job_log "$id" | grep -c "launch ended: exit ")" -eq 2 ] || { show_job "$id"; fail "expected 2 launches"; }
job_log "$id" | has "FAILED after 1 restart(s) (MAX_FAILURE_RESTARTS 1): exit [0-9]*: a rank failed, or the launcher could not start the ranks" ||
  { show_job "$id"; fail "no FAILED line with the reason"; }
echo "ok: a launch that fails ends FAILED after 1 restart, with the reason"

# 2b. A launch that exits 0 without running training (the binary is not
# mpiformer; srun has also been seen to return 0 after failing to start
# the ranks): no RUN_DIR/finished, so FAILED, never COMPLETED.
id=$(MAX_FAILURE_RESTARTS=1 MPIFORMER=/bin/true MPIFORMER_ARGS="$args" RUN_DIR=hollow \
     sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" FAILED COMPLETED || { show_job "$id"; fail "job did not end"; }
job_state "$id" FAILED || { show_job "$id"; fail "exit 0 without finishing must end FAILED"; }
job_log "$id" | has "FAILED after 1 restart(s) (MAX_FAILURE_RESTARTS 1): exit 0 without reaching the last step" ||
  { show_job "$id"; fail "no FAILED line naming the missing finish"; }
echo "ok: exit 0 without finishing ends the job FAILED"

# 3. No healthy node to restart on: the node is drained while the job runs
# (running jobs go on), then a rank dies.
id=$(MPIFORMER_ARGS="$args --set train.steps=400" RUN_DIR=drained sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" RUNNING || { show_job "$id"; fail "job did not start"; }
wait_steps drained/metrics.jsonl 3 || { show_job "$id"; fail "the run did not start"; }
scontrol update NodeName=localhost State=DRAIN Reason=mpiformer-test
kill -KILL "$(ranks_here | tail -1)"  # this test's ranks, never another test's
wait_job "$id" FAILED COMPLETED || { show_job "$id"; fail "job did not end"; }
scontrol update NodeName=localhost State=RESUME
job_state "$id" FAILED || { show_job "$id"; fail "a restart without healthy nodes must fail"; }
job_log "$id" | has -E "node localhost: Slurm says (drain|drng)" || { show_job "$id"; fail "the drained node was not noticed"; }
job_log "$id" | has -F "FAILED: cannot restart: only 0 of 1 nodes are healthy, fewer than MIN_NODES 1" ||
  { show_job "$id"; fail "no reason for giving up"; }
echo "ok: with no healthy node the job ends FAILED, saying why"
