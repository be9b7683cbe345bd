#!/usr/bin/env bash
# Outside Slurm: SIGTERM to mpirun and the time guard both end the run after
# an agreed step with a checkpoint and exit code 75; the run resumes from it.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
# shellcheck disable=SC2206  # SMALL_BATCH's words are the arguments
args=(--set train.steps=300 --set train.log_every=1 --set train.eval_every=0 --set parallel.pp=2
      $SMALL_BATCH --set run.peak_tflops=1)
mpirun -np 2 "$MPIFORMER" train "$DECK" "${args[@]}" --set run.dir=sig >sig.log 2>&1 &
pid=$!
for i in $(seq 1 120); do
  [ "$(grep -c '"loss"' sig/metrics.jsonl 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 0.5
done
# To the ranks themselves, as Slurm's scancel and preemption deliver it.
pkill -TERM -f "^$MPIFORMER train .*run.dir=sig"
sleep 0.2
pkill -TERM -f "^$MPIFORMER train .*run.dir=sig" || true  # a second signal, likely during the save
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 75 ] || { cat sig.log; fail "SIGTERM: exit $rc, expected 75"; }
grep -q "stopping after step .* to be requeued (SIGTERM)" sig.log || { cat sig.log; fail "no stop line"; }
"$MPIFORMER" inspect sig/checkpoints/step_*.h5 | has "all 156 datasets verify" || fail "checkpoint after SIGTERM is damaged"
echo "ok: SIGTERM"

rc=0
run_mpi 1 train "$DECK" --set train.steps=300 --set train.eval_every=0 --set run.dir=tl \
  --set run.time_limit=4 >tl.log 2>&1 || rc=$?
[ "$rc" -eq 75 ] || { cat tl.log; fail "time limit: exit $rc, expected 75"; }
grep -q "to be requeued (time limit)" tl.log || { cat tl.log; fail "no time-limit stop"; }
stopped=$(sed -n 's/stopping after step \([0-9]*\) .*/\1/p' tl.log)
run_mpi 1 train "$DECK" --set train.steps=$((stopped + 2)) --set train.eval_every=0 --set run.dir=tl >tl2.log 2>&1 ||
  { cat tl2.log; fail "resume after the time limit failed"; }
grep -q "resumed from tl/checkpoints/step_$(printf %08d "$stopped").h5" tl2.log || { cat tl2.log; fail "no resume"; }
echo "ok: time guard stopped at step $stopped and the run resumed"

# The workstation launcher: Ctrl-C (SIGINT), SIGTERM and SIGHUP (a closed
# terminal) to jobs/local.sh reach the ranks as SIGUSR1, so the run
# checkpoints and the exit code is 75 (mpirun's own SIGTERM handling kills
# the ranks after a short grace and exits 1). Job control on: a background job would otherwise ignore SIGINT.
set -m
for sig in INT TERM HUP; do
  MPIFORMER="$MPIFORMER" "$SOURCE_DIR/jobs/local.sh" "$DECK" "${args[@]}" --set run.dir="l$sig" >"l$sig.log" 2>&1 &
  pid=$!
  for i in $(seq 1 120); do
    [ "$(grep -c '"loss"' "l$sig/metrics.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
    sleep 0.5
  done
  kill -"$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 75 ] || { cat "l$sig.log"; fail "SIG$sig to jobs/local.sh: exit $rc, expected 75"; }
  grep -q "to be requeued (SIGUSR1)" "l$sig.log" || { cat "l$sig.log"; fail "SIG$sig: no checkpoint-and-stop"; }
  ls "l$sig"/checkpoints/step_*.h5 >/dev/null || fail "SIG$sig: no checkpoint"
  echo "ok: SIG$sig to jobs/local.sh checkpointed and exited 75"
done
set +m
