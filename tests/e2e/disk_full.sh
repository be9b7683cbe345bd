#!/usr/bin/env bash
# A full file system under the checkpoint directory, on a small tmpfs made
# here: the save of step 2 either cannot start (less free than the tensors'
# bytes: refused before writing) or fails part-way (more free than the
# tensors but less than the file). Either way the job ends at once, exit 2
# on every rank, with a message saying so; no partial file is left; step 1's
# checkpoint is intact and the run resumes from it once there is room.
source "$(dirname "$0")/lib.sh"
mkdir -p small
if ! mount -t tmpfs -o size=64M tmpfs small 2>mount.err; then
  echo "SKIP: cannot mount a tmpfs here ($(cat mount.err)); needs root and CAP_SYS_ADMIN"
  exit 77
fi
trap 'umount "$WORK/small" 2>/dev/null; rm -rf "$WORK"' EXIT
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
# shellcheck disable=SC2206  # SMALL_BATCH's words are the arguments
args=(--set train.eval_every=0 --set checkpoint.every=1 --set checkpoint.keep=1
      --set checkpoint.dir=small/ck --set parallel.dp=2 $SMALL_BATCH --set run.peak_tflops=1)

# The sizes: the tensors' bytes (3 x 4 x parameters) and the whole file.
run_mpi 2 train "$DECK" "${args[@]}" --set train.steps=1 --set checkpoint.dir=ref --set run.dir=ref \
  >ref.log 2>&1 || { cat ref.log; fail "reference run failed"; }
params=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' ref.log)
raw=$((12 * params))
file=$(stat -c %s ref/step_00000001.h5)
page=4096
pages() { echo $(( ($1 + page - 1) / page * page )); }
[ $((file - raw)) -gt $((4 * page)) ] || fail "HDF5's overhead ($((file - raw)) bytes) is too small for this test"

# try NAME FREE: leaves FREE bytes for the second save, then runs 2 steps.
try() {
  local name=$1 free=$2
  rm -rf small/ck small/filler
  mkdir -p small/ck
  local avail
  avail=$(df -B1 --output=avail small | tail -1)
  # Step 1's file, `latest` and the directory lock take their pages first.
  fallocate -l $((avail - $(pages "$file") - 3 * page - free)) small/filler
  rc=0
  timeout 120 mpirun -np 2 "$MPIFORMER" train "$DECK" "${args[@]}" --set train.steps=2 \
    --set run.dir="$name" >"$name.log" 2>"$name.err" || rc=$?
  [ "$rc" -eq 2 ] || { cat "$name.log" "$name.err"; fail "$name: exit $rc, expected 2"; }
  grep -q "small/ck: \[checkpoint\] dir: no space left on its file system: the checkpoint of step 2 needs" "$name.err" ||
    { cat "$name.err"; fail "$name: no message about the space"; }
  [ "$(grep -c 'mpiformer: error' "$name.err")" -eq 1 ] || fail "$name: the message should be printed once"
  ! ls small/ck/*.tmp 2>/dev/null || fail "$name: a partial file was left"
  [ "$(head -1 small/ck/latest)" = step_00000001.h5 ] || fail "$name: latest changed"
  "$MPIFORMER" inspect small/ck/step_00000001.h5 | has "all 156 datasets verify" ||
    fail "$name: step 1's checkpoint is damaged"
  grep "mpiformer: error" "$name.err"
  echo "ok: $name: exit 2, the message once, nothing partial, step 1 intact"
}

try before $((raw - 1000000))
grep -q "nothing was written" before.err || { cat before.err; fail "the refusal did not say nothing was written"; }
try during $((raw + (file - raw) / 2))
grep -q "the partial file was removed" during.err || { cat during.err; fail "no partial-file removal"; }
# Room for all but the file's last pages, where HDF5's final collective
# metadata flush writes: one rank failing inside it left the other waiting
# in a broadcast (a hang). The save reserves the whole file first.
for k in 1 2 4; do try "flush$k" $((file - k * page)); done

# With room again, the run resumes from step 1 and completes.
rm -f small/filler
run_mpi 2 train "$DECK" "${args[@]}" --set train.steps=2 --set run.dir=during >resume.log 2>&1 ||
  { cat resume.log; fail "resume after freeing space failed"; }
grep -q "resumed from small/ck/step_00000001.h5" resume.log || { cat resume.log; fail "no resume"; }
echo "ok: the run resumed from step 1 once there was room"

# A full run directory mid-run: metrics.jsonl keeps whole lines only, the
# job ends with exit 74 (an output could not be written), which
# jobs/local.sh does not restart; with room again the run resumes and
# jobs/plot-metrics.py reads the whole run.
rm -rf small/ck small/filler small/rd
mkdir -p small/rd
avail=$(df -B1 --output=avail small | tail -1)
fallocate -l $((avail - 6 * page)) small/filler
rc=0
MAX_FAILURE_RESTARTS=3 RESTART_BACKOFF_S=1 MPIFORMER="$MPIFORMER" timeout 300 "$SOURCE_DIR/jobs/local.sh" "$DECK" \
  --set parallel.dp=2 --set train.steps=300 --set train.log_every=1 --set train.eval_every=0 $SMALL_BATCH \
  --set checkpoint.every=10 --set checkpoint.dir=rdck --set run.dir=small/rd --set run.peak_tflops=1 \
  >rd.log 2>&1 || rc=$?
[ "$rc" -eq 74 ] || { tail -20 rd.log; fail "a full run directory: exit $rc, expected 74"; }
grep -q "fatal on rank 0: cannot write small/rd/metrics.jsonl: .*(an output could not be written" rd.log || { tail -20 rd.log; fail "no message"; }
grep -q "launch ended: an output could not be written (exit 74" rd.log || { tail -5 rd.log; fail "no outcome line"; }
[ "$(grep -c "launch ended" rd.log)" -eq 1 ] || { tail -5 rd.log; fail "a full disk was restarted"; }
python3 -c "
import json, sys
lines = open('small/rd/metrics.jsonl').read().split('\n')
assert lines[-1] == '', 'the file does not end with a whole line'
[json.loads(l) for l in lines[:-1]]
print(f'ok: {len(lines) - 1} whole JSON lines, none torn')"
rm -f small/filler
run_mpi 2 train "$DECK" --set parallel.dp=2 --set train.steps=25 --set train.log_every=1 --set train.eval_every=0 $SMALL_BATCH \
  --set checkpoint.every=10 --set checkpoint.dir=rdck --set run.dir=small/rd >rd2.log 2>&1 ||
  { tail -20 rd2.log; fail "resume after freeing the run directory"; }
/usr/bin/python3 "$SOURCE_DIR/jobs/plot-metrics.py" small/rd >plot.log 2>&1 || { cat plot.log; fail "plot-metrics refused the resumed run"; }
echo "ok: a full run directory ends with exit 74, no torn line; the resumed run plots"

# prep to a full disk: an error, and no OUT.h5.tmp left behind.
fallocate -l $(( $(df -B1 --output=avail small | tail -1) - 64 * 1024 )) small/filler
rc=0
"$MPIFORMER" prep --tokenizer byte --output small/prep.h5 "$SOURCE_DIR/inputs/tinyshakespeare.txt" >prep.log 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "prep to a full disk exited 0"
! ls small/prep.h5* >/dev/null 2>&1 || { ls small; fail "prep to a full disk left $(ls small/prep.h5*)"; }
echo "ok: prep to a full disk fails and leaves nothing"
