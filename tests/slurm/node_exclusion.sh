#!/usr/bin/env bash
# Under a real two-node Slurm, the run directory's memory of bad nodes
# (jobs/node-memory.sh):
#  1. a node that passes Slurm's state and the probe step but on which a
#     rank dies twice: the first failure is laid to it and the run restarts
#     on both nodes; the second reaches MAX_NODE_FAILURES (2), the node is
#     excluded though it is healthy, and the run finishes on the other with
#     [parallel] auto, the uninterrupted run's losses within 1e-4 (as in
#     node_lost.sh: another summation order after the restart);
#  2. a new job in a run directory whose unhealthy-hosts (as mpiformer's
#     health check writes it) names node2: the first launch leaves node2
#     out, and a job pending on this one (the next segment of a chain) is
#     kept off it by Slurm (its ExcNodeList).
# LAUNCHER=mpirun, as in node_lost.sh (Slurm's PMIx plugin cannot start one
# step on two slurmd of the same host).
export SLURM_NODES=2
source "$(dirname "$0")/lib.sh"
export RESTART_BACKOFF_S=1 HEALTH_TIMEOUT_S=15 MIN_NODES=1 LAUNCHER=mpirun
args="$SMALL --set parallel.dp=2 --set train.steps=30 --set train.eval_every=0 --set checkpoint.every=8"
run_mpi 2 calibrate "$DECK" --seconds 0.003 -o machine.toml >cal.log 2>&1 || { cat cal.log; fail "calibrate"; }
export MACHINE=$WORK/machine.toml

# kill_rank_on NODE: SIGKILL to this test's rank that Slurm placed on NODE.
kill_rank_on() {
  local p
  for p in $(ranks_here); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | has -x "SLURMD_NODENAME=$1" && kill -9 "$p"
  done
  return 0
}
# wait_lines FILE PATTERN N: until FILE has N lines matching PATTERN (60 s).
wait_lines() {
  for _ in $(seq 1 240); do
    [ "$(grep -c "$2" "$1" 2>/dev/null)" -ge "$3" ] 2>/dev/null && return 0
    sleep 0.25
  done
  return 1
}

# 1. A rank on node2 killed in two launches.
id=$(MPIFORMER_ARGS="$args" RUN_DIR=flaky sbatch --parsable -N 2 --ntasks-per-node=1 "$SBATCH_SCRIPT")
wait_job "$id" RUNNING || { show_job "$id"; fail "job did not start"; }
wait_lines flaky/metrics.jsonl '"loss"' 10 || { show_job "$id"; fail "the run did not reach step 10"; }
kill_rank_on node2
# The restart (on both nodes: node2 is healthy) resumes from step 8.
wait_lines "mpiformer-$id.out" "resumed from" 1 || { show_job "$id"; fail "no restart"; }
wait_lines flaky/metrics.jsonl '"loss"' 13 || { show_job "$id"; fail "the restart did not train"; }
kill_rank_on node2
for _ in $(seq 1 300); do
  job_log "$id" | has "^== run finished\|^== FAILED" && break
  sleep 1
done
wait_job "$id" COMPLETED FAILED || { show_job "$id"; fail "job did not end"; }
job_state "$id" COMPLETED || { show_job "$id"; fail "the job did not finish without node2"; }
for want in "== node node2: a rank there ended by a signal (failed launch 1 laid to it of MAX_NODE_FAILURES 2)" \
            "healthy nodes: node1 node2 (2 of 2; MIN_NODES 1)" \
            "== node node2: a rank there ended by a signal (failed launch 2 laid to it of MAX_NODE_FAILURES 2)" \
            "== node node2 excluded: 2 failed launch(es) laid to it (node-failures; MAX_NODE_FAILURES 2)" \
            "healthy nodes: node1 (1 of 2; MIN_NODES 1)" "mpirun -np 1 --host node1:1" \
            "launch ended: finished step 30 of 30"; do
  job_log "$id" | has -F -- "$want" || { show_job "$id"; fail "no '$want' in the job log"; }
done
[ "$(awk '$1 == "node2"' flaky/node-failures | wc -l)" -eq 2 ] || { cat flaky/node-failures; fail "node-failures does not hold node2 twice"; }
run_mpi 2 train "$DECK" $args --set run.dir=straight >straight.log 2>&1 || { cat straight.log; fail "uninterrupted run failed"; }
same_losses flaky/metrics.jsonl straight/metrics.jsonl 30 1e-4 "node2 excluded after two failures"

# 2. node2 named by the health check: left out from the first launch, and
# the next job of a chain kept off it.
mkdir -p named
echo "node2 $(date +%s) rank 1 on node2: GEMM 1.0 GFLOP/s, 0.10 of the median" >named/unhealthy-hosts
short="$SMALL --set parallel.dp=2 --set train.steps=6 --set train.eval_every=0"
id=$(MPIFORMER_ARGS="$short" RUN_DIR=named sbatch --parsable -N 2 --ntasks-per-node=1 "$SBATCH_SCRIPT")
next=$(sbatch --parsable --dependency=afterany:"$id" -N 1 --wrap true)
wait_job "$id" COMPLETED FAILED || { show_job "$id"; fail "job did not end"; }
job_state "$id" COMPLETED || { show_job "$id"; fail "the job did not run on node1"; }
for want in "== node node2 excluded: named by the health check (unhealthy-hosts)" \
            "mpirun -np 1 --host node1:1" "launch ended: finished step 6 of 6" \
            "== the next job $next will not run on node2"; do
  job_log "$id" | has -F -- "$want" || { show_job "$id"; fail "no '$want' in the job log"; }
done
scontrol show job "$next" | has "ExcNodeList=node2" || { scontrol show job "$next"; fail "the next job may run on node2"; }
echo "ok: a node that keeps failing, and one the health check named, are left out"
