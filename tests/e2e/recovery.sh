#!/usr/bin/env bash
# jobs/local.sh without a person: a rank SIGKILLed mid-run is restarted from
# the last checkpoint and the run ends with the uninterrupted run's losses;
# a launch that fails or exits 0 without finishing ends FAILED after
# MAX_FAILURE_RESTARTS restarts, with the reason; bad input is never
# restarted; SIGKILL to the launcher script, or to mpirun, does not leave the
# ranks training: they checkpoint and stop.
source "$(dirname "$0")/lib.sh"
# Launches tear down as a user's do: mpirun's own grace (lib.sh drops it).
unset OMPI_MCA_odls_base_sigkill_timeout
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
LOCAL="$SOURCE_DIR/jobs/local.sh"
export RESTART_BACKOFF_S=1
args=(--set parallel.dp=2 --set train.steps=40 --set train.global_batch=8 --set train.micro_batch=4
      --set train.log_every=1 --set train.eval_every=20 --set checkpoint.every=8
      --set run.peak_tflops=1)
wait_steps() {  # wait_steps METRICS N: until N losses are logged
  for _ in $(seq 1 240); do
    [ "$(grep -c '"loss"' "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0
    sleep 0.25
  done
  return 1
}

# The reference: one launch, no fault. The transport tuning it runs under
# is recorded: the log header and the first line of metrics.jsonl name the
# NCCL_*, UCX_* and OMPI_MCA_* variables set (lib.sh's pml and yield among
# them; its singleton setting does not reach ranks that mpirun starts), not
# mpirun's own bookkeeping.
NCCL_DEBUG=WARN NCCL_ALGO=Ring OMPI_MCA_btl_base_verbose=0 \
  "$LOCAL" "$DECK" "${args[@]}" --set run.dir=straight >straight.log 2>&1 || { cat straight.log; fail "uninterrupted run"; }
grep -q "launch ended: finished step 40 of 40" straight.log || { cat straight.log; fail "no finished line"; }
[ ! -e straight/failure-restarts ] || fail "a run without faults counted a restart"
grep -q "^env:   NCCL_ALGO=Ring NCCL_DEBUG=WARN OMPI_MCA_btl_base_verbose=0 OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_pml=ob1 OMPI_MCA_rmaps_base_oversubscribe=1 (rank 0)$" straight.log ||
  { grep "^env:" straight.log; fail "the log header does not record the environment"; }
python3 - straight/metrics.jsonl <<'PY'
import json, sys
first = json.loads(open(sys.argv[1]).readline())
env = first["environment"]
assert env == {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN", "OMPI_MCA_btl_base_verbose": "0",
               "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_pml": "ob1",
               "OMPI_MCA_rmaps_base_oversubscribe": "1"}, env
assert "nccl" not in first, "a host run names no NCCL version"
PY

# A rank SIGKILLed after the checkpoint at step 8: the launch fails, the
# script restarts it, the run resumes from step 8 and finishes.
"$LOCAL" "$DECK" "${args[@]}" --set run.dir=killed >killed.log 2>&1 &
pid=$!
wait_steps killed/metrics.jsonl 11 || { cat killed.log; fail "the run did not reach step 11"; }
victim=$(ranks_here | tail -1)
[ -n "$victim" ] || fail "no rank to kill"
kill -KILL "$victim"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { cat killed.log; fail "the restarted run ended with $rc"; }
grep -q "failure restart 1 of at most 3 (1 in this run directory) after: .*signal" killed.log ||
  { cat killed.log; fail "no restart line naming the signal"; }
grep -qE "after: .*; [0-9]+ step\(s\) since the last checkpoint are redone" killed/restarts.log ||
  { cat killed/restarts.log; fail "restarts.log lacks the lost steps"; }
[ "$(cat killed/failure-restarts)" = 1 ] || fail "failure-restarts: $(cat killed/failure-restarts)"
grep -q "resumed from killed/checkpoints/step_000000" killed.log || { cat killed.log; fail "the restart did not resume"; }
grep -q "launch ended: finished step 40 of 40" killed.log || { cat killed.log; fail "not finished"; }
python3 - "$(last_losses straight/metrics.jsonl)" "$(last_losses killed/metrics.jsonl)" <<'PY'
import json, sys
ref, got = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert sorted(map(int, got)) == list(range(1, 41)), sorted(got)
# 1e-5 relative: the issue's bound for an exact resume (it is bitwise here:
# same layout, same reduction order).
bad = [s for s in ref if abs(got[s] - ref[s]) > 1e-5 * abs(ref[s])]
assert not bad, f"steps {bad[:5]} differ: {[(got[s], ref[s]) for s in bad[:3]]}"
print(f"killed and restarted: final loss {got['40']} equals the uninterrupted run's {ref['40']}")
PY
echo "ok: a SIGKILLed rank restarted and finished with the same losses"

# Goodput across the two launches, against the step times metrics.jsonl
# logged (every step: log_every 1), split into launches at each launch's
# first record (its environment). The killed launch's steps after the
# checkpoint at 8 were redone: their time is lost, the rest is
# productive. Tolerances: the log rounds each step's milliseconds to 6
# digits (1e-4 relative over the sum); the ledger may hold one step more
# of the killed launch than its log (written just before the step's log
# line), which the lost time's bound allows.
goodput_check() {  # RUN_DIR LAUNCHES
  python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
launches, cur, goodput = [], None, None
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "environment" in j:
        cur = []
        launches.append(cur)
    elif "loss" in j and "step_ms" in j:
        cur.append((j["step"], j["step_ms"] / 1e3))
    elif "goodput" in j:
        goodput = j["goodput"]
assert len(launches) == int(sys.argv[2]), len(launches)
g = goodput
assert g["launches"] == len(launches), g
kept, lost, redone = {}, 0.0, 0
for i, steps in enumerate(launches):
    resume = launches[i + 1][0][0] - 1 if i + 1 < len(launches) else None
    for step, s in steps:
        if resume is not None and step > resume:
            lost, redone = lost + s, redone + 1
        else:
            kept[step] = s
productive = sum(kept.values())
assert abs(g["productive_s"] - productive) <= 1e-4 * productive, (g, productive)
if len(launches) == 1:
    assert g["steps_redone"] == 0 and g["lost_s"] <= 1e-4 * productive, g
else:
    # Usually steps after the last checkpoint are redone; a kill that lands
    # right after a save (the steps are ~30 ms, the kill follows a 0.25 s
    # poll) redoes none, and loses only the step in flight, if any.
    assert g["steps_redone"] in (redone, redone + 1), (g, redone)
    assert g["lost_s"] >= lost * (1 - 1e-4) and (redone == 0 or g["lost_s"] > 0), (g, lost)
    assert g["between_launches_s"] >= 1, g  # RESTART_BACKOFF_S
parts = g["productive_s"] + g["lost_s"] + g["save_s"] + g["startup_s"] + g["eval_s"]
assert parts <= g["wall_s"] * 1.01 + 0.05, g
assert 0 < g["goodput"] < 1 and abs(g["goodput"] - g["productive_s"] / g["wall_s"]) < 1e-5, g
print(f"goodput {g['goodput']:.3f} over {len(launches)} launch(es), {g['steps_redone']} step(s) redone")
PY
}
goodput_check straight 1 || fail "goodput of the uninterrupted run"
goodput_check killed 2 || fail "goodput of the killed and restarted run"
# (Redone steps may be 0: a kill right after a save, as above.)
grep -qE "^goodput [0-9.]+%: .*\(2 launches\).*redone steps .* \([0-9]+\); .* between launches" killed.log ||
  { grep "^goodput" killed.log; fail "no goodput line over both launches"; }
echo "ok: goodput over launches matches the logged step times"

# A launch that exits 0 without running the program (no finished marker):
# FAILED after exactly MAX_FAILURE_RESTARTS restarts, with the reason.
rc=0
MAX_FAILURE_RESTARTS=2 MPIFORMER=/bin/true "$LOCAL" "$DECK" --set run.dir=hollow >hollow.log 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { cat hollow.log; fail "exit 0 without finishing reported as success"; }
[ "$(grep -c "launch ended: exit 0 without reaching the last step" hollow.log)" -eq 3 ] ||
  { cat hollow.log; fail "expected 3 launches (2 restarts)"; }
grep -q "FAILED after 2 restart(s) (MAX_FAILURE_RESTARTS 2)" hollow.log || { cat hollow.log; fail "no FAILED line"; }
[ "$(cat hollow/failure-restarts)" = 2 ] || fail "hollow/failure-restarts: $(cat hollow/failure-restarts)"
echo "ok: exit 0 without finishing ends FAILED after 2 restarts"

# A launch that fails at once (exit 1) with MAX_FAILURE_RESTARTS=0: one
# launch, FAILED.
rc=0
MAX_FAILURE_RESTARTS=0 MPIFORMER=/bin/false "$LOCAL" "$DECK" --set run.dir=none >none.log 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { cat none.log; fail "MAX_FAILURE_RESTARTS=0: exit $rc, expected 1"; }
[ "$(grep -c "launch ended" none.log)" -eq 1 ] || { cat none.log; fail "MAX_FAILURE_RESTARTS=0 restarted"; }
echo "ok: MAX_FAILURE_RESTARTS=0 restarts nothing"

# Bad input is a person's to fix: exit 2 at once, never restarted.
rc=0
"$LOCAL" "$DECK" --set train.lr=-1 --set run.dir=bad >bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat bad.log; fail "bad input: exit $rc, expected 2"; }
[ "$(grep -c "launch ended" bad.log)" -eq 1 ] || { cat bad.log; fail "bad input was restarted"; }
echo "ok: bad input exits 2 without a restart"

# SIGKILL to the launcher script: its guard asks the ranks to checkpoint and
# stop, so none trains on without it; the run directory is free again.
# kill_launcher PID DIR: SIGKILL to PID once DIR's run has logged 3 steps,
# then no rank of that run may be left after 30 s.
kill_launcher() {
  wait_steps "$2/metrics.jsonl" 3 || { cat "$2.log"; fail "the run did not start"; }
  kill -KILL "$1"
  for _ in $(seq 1 120); do
    pgrep -f "mpiformer train .*run.dir=$2" >/dev/null || return 0
    sleep 0.25
  done
  cat "$2.log"
  pgrep -af mpiformer
  fail "ranks of $2 still running 30 s after their launcher was killed"
}
"$LOCAL" "$DECK" "${args[@]}" --set train.steps=400 --set run.dir=orphan >orphan.log 2>&1 &
kill_launcher $! orphan
grep -q "to be requeued (SIGUSR1)" orphan.log || { cat orphan.log; fail "the ranks did not checkpoint and stop"; }
run_mpi 2 train "$DECK" "${args[@]}" --set train.steps=400 --set train.stop_at=6 --set run.dir=orphan >orphan2.log 2>&1 ||
  { cat orphan2.log; fail "the run directory is still locked"; }
echo "ok: SIGKILL to jobs/local.sh stopped the ranks with a checkpoint"

# SIGKILL to mpirun itself: the ranks see their launcher gone, checkpoint
# and stop (without it they train on, or die at their next log line).
mpirun -np 2 "$MPIFORMER" train "$DECK" "${args[@]}" --set train.steps=400 --set checkpoint.every=0 \
  --set run.dir=headless >headless.log 2>&1 &
kill_launcher $! headless
ls headless/checkpoints/step_*.h5 >/dev/null 2>&1 || fail "the ranks left no checkpoint when mpirun vanished"
echo "ok: SIGKILL to mpirun: the ranks checkpointed and stopped"
