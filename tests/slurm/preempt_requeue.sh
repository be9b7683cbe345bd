#!/usr/bin/env bash
# A job that receives the preemption signal mid-training checkpoints, exits
# 75, is requeued, resumes from `latest` and completes; its losses equal an
# uninterrupted run's at every step, bit for bit (same layout).
source "$(dirname "$0")/lib.sh"
# 120 steps: at 14 ms a step (an idle machine) the job lasts well past the
# signal below; 40 once finished before it arrived.
args="$SMALL --set parallel.dp=2 --set train.steps=120 --set train.eval_every=0"
id=$(MPIFORMER_ARGS="$args" RUN_DIR=run sbatch --parsable -n 2 "$SBATCH_SCRIPT")
wait_job "$id" RUNNING || { show_job "$id"; fail "job did not start"; }
for i in $(seq 1 600); do
  [ "$(grep -c '"loss"' run/metrics.jsonl 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 0.1
done
scancel --signal=USR1 --batch "$id"
wait_job "$id" PENDING COMPLETED || { show_job "$id"; fail "job was not requeued"; }
job_log "$id" | has "stopping after step .* to be requeued (SIGUSR1); exit code 75" ||
  { show_job "$id"; fail "no checkpoint-and-stop in the log"; }
job_log "$id" | has "requeuing job $id" || { show_job "$id"; fail "not requeued by the script"; }
# Slurm holds a requeued job for a while (BeginTime): release it now, once
# slurmd has cleaned up the old step (a step launched while the previous one
# with the same id is still terminating fails to start).
for i in $(seq 1 60); do
  [ -z "$(squeue -h -s -j "$id" 2>/dev/null)" ] && break
  sleep 1
done
sleep 3
scontrol update JobId="$id" StartTime=now
wait_job "$id" COMPLETED || { show_job "$id"; fail "requeued job did not complete"; }
job_log "$id" | has "restart count 1" || { show_job "$id"; fail "second run not logged as restart 1"; }
job_log "$id" | has "resumed from run/checkpoints/step_" || { show_job "$id"; fail "did not resume"; }
job_log "$id" | has -E "^final val loss" || { show_job "$id"; fail "no final val loss"; }

# The same run without interruption, outside Slurm.
run_mpi 2 train "$DECK" $args --set run.dir=straight >straight.log 2>&1 || fail "uninterrupted run failed"
same_losses run/metrics.jsonl straight/metrics.jsonl 120 0 "requeued run"
