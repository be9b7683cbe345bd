#!/usr/bin/env bash
# One job per run directory: a second job started while the first runs is
# refused at once (exit 2, naming the holder) and touches nothing; once the
# first is dead (even by SIGKILL, leaving its lock file behind) a new job
# runs in the directory and resumes from it.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
args=(--set train.steps=400 --set train.log_every=1 --set train.eval_every=0 --set run.dir=shared
      --set checkpoint.every=2)

run_mpi 1 train "$DECK" "${args[@]}" >first.log 2>&1 &
first=$!
for i in $(seq 1 120); do
  [ -s shared/checkpoints/latest ] && break
  sleep 0.5
done
[ -s shared/checkpoints/latest ] || { cat first.log; fail "the first job did not start"; }

rc=0
timeout 120 mpirun -np 2 "$MPIFORMER" train "$DECK" "${args[@]}" --set parallel.dp=2 \
  --set train.micro_batch=8 >second.log 2>second.err || rc=$?
[ "$rc" -eq 2 ] || { cat second.log second.err; fail "second job: exit $rc, expected 2"; }
grep -qF "shared: [run] dir: another job is using this directory (host" second.err ||
  { cat second.err; fail "the second job's message does not name the holder"; }
grep -qF "pid " second.err || fail "no pid in the message"
[ "$(grep -c 'mpiformer: error' second.err)" -eq 1 ] || fail "the message should be printed once"
kill -0 "$first" 2>/dev/null || { cat first.log; fail "the first job died"; }
echo "ok: a second job in the same run directory is refused, naming the holder"

# A dead holder (SIGKILL: no clean-up) leaves the file but not the lock.
pkill -KILL -f "^$MPIFORMER train .*run.dir=shared" || true
wait "$first" 2>/dev/null || true
[ -e shared/.lock ] || fail "no lock file was left to test a stale lock with"
run_mpi 1 train "$DECK" "${args[@]}" --set train.steps=3 >third.log 2>&1 ||
  { cat third.log; fail "a job after a killed one was refused"; }
grep -q "resumed from" third.log || { cat third.log; fail "the third job did not resume"; }
echo "ok: a stale lock from a killed job does not block the next one"
