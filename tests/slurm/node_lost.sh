#!/usr/bin/env bash
# Under a real two-node Slurm: a job on both nodes loses one (its slurmd and
# its rank killed, as when a node dies). The script's health check leaves
# the dead node out, the run restarts on the node left with the layout
# [parallel] auto plans for one rank, the same global batch, and ends with
# the uninterrupted two-rank run's losses within 1e-4: after the restart it
# sums in another order (1 rank x micro-batch 8 against 2 x 4) for up to 22
# steps, and AdamW grows those 1e-7 roundings (layout_equivalence.sh allows
# 1e-5 over 6 steps; 1.2e-5 was the worst seen here over 30).
# LAUNCHER=mpirun: Slurm's PMIx plugin cannot start one step on two slurmd
# of the same host (their PMIx directories collide); mpirun starts its
# daemons with srun --mpi=none, which can.
export SLURM_NODES=2
source "$(dirname "$0")/lib.sh"
export RESTART_BACKOFF_S=1 HEALTH_TIMEOUT_S=15 MIN_NODES=1
args="$SMALL --set parallel.dp=2 --set train.steps=30 --set train.eval_every=0 --set checkpoint.every=8"
# A machine file for the planner: this host, measured under mpirun.
run_mpi 2 calibrate "$DECK" --seconds 0.003 -o machine.toml >cal.log 2>&1 || { cat cal.log; fail "calibrate"; }
id=$(LAUNCHER=mpirun MACHINE="$WORK/machine.toml" MPIFORMER_ARGS="$args" RUN_DIR=lost \
     sbatch --parsable -N 2 --ntasks-per-node=1 "$SBATCH_SCRIPT")
wait_job "$id" RUNNING || { show_job "$id"; fail "job did not start"; }
for _ in $(seq 1 240); do
  [ "$(grep -c '"loss"' lost/metrics.jsonl 2>/dev/null)" -ge 11 ] 2>/dev/null && break
  sleep 0.25
done
# node2 dies: its slurmd first, then the rank it ran.
kill -9 "$(cat "$SLURM_TEST_DIR/slurmd-node2.pid")"
for p in $(pgrep -x mpiformer); do
  tr '\0' '\n' <"/proc/$p/environ" | has -x SLURMD_NODENAME=node2 && kill -9 "$p"
done
# The batch script's end is the verdict: Slurm keeps the job COMPLETING
# until it declares the dead node down (SlurmdTimeout, minutes).
for _ in $(seq 1 300); do
  job_log "$id" | has "^== run finished\|^== FAILED" && break
  sleep 1
done
wait_job "$id" COMPLETED COMPLETING FAILED || { show_job "$id"; fail "job did not end"; }
scontrol show job "$id" | has " ExitCode=0:0" || { show_job "$id"; fail "the job did not finish on the node left"; }
for want in "node node2: the probe step failed or took more than 15 s" \
            "healthy nodes: node1 (1 of 2; MIN_NODES 1)" "mpirun -np 1 --host node1:1" \
            "--set parallel.auto=true --set run.machine=$WORK/machine.toml" \
            "auto:  dp 1 pp 1 tp 1 " "launch ended: finished step 30 of 30"; do
  job_log "$id" | has -F -- "$want" || { show_job "$id"; fail "no '$want' in the job log"; }
done
run_mpi 2 train "$DECK" $args --set run.dir=straight >straight.log 2>&1 || { cat straight.log; fail "uninterrupted run failed"; }
same_losses lost/metrics.jsonl straight/metrics.jsonl 30 1e-4 "lost a node, finished on the other"
echo "ok: a lost node is left out and the run finishes on the node left"
