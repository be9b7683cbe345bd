#!/usr/bin/env bash
# Every file a run creates or truncates refuses a link planted in its place
# (shared scratch without a sticky bit is common on clusters): a victim file
# behind each link keeps its bytes. Locks and metrics.jsonl, opened in
# place, refuse the link by name (exit 2, nothing written); files the run
# replaces anyway (a checkpoint's and `latest`'s .tmp, heartbeats, traces)
# lose the link and the run goes on. The job scripts' own records
# (failure-restarts, restarts.log) refuse a link too.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
common=(--set train.steps=2 --set train.log_every=1 --set train.eval_every=0
        --set train.global_batch=4 --set train.micro_batch=4)
printf 'precious\n' >victim.txt
victim_intact() {  # label
  [ "$(cat victim.txt)" = precious ] || fail "$1: the link's target was written"
}

# refused RUN_DIR LINK [ARGS...]: LINK (under the run) -> victim.txt; the
# run must exit 2 naming LINK, the victim untouched.
refused() {
  local dir=$1 link=$2
  shift 2
  local rc=0
  run_mpi 1 train "$DECK" "${common[@]}" --set run.dir="$dir" "$@" >"$dir.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "$dir.log"; fail "$link: exit $rc, expected 2"; }
  grep -q "$link.*not a regular file (a symbolic link): refusing to write through it" "$dir.log" ||
    { cat "$dir.log"; fail "$link: the message does not name the link"; }
  victim_intact "$link"
}

mkdir -p r1 && ln -s "$WORK/victim.txt" r1/.lock
refused r1 "r1/.lock"
mkdir -p r2/ck && ln -s "$WORK/victim.txt" r2/ck/.lock
refused r2 "r2/ck/.lock" --set checkpoint.dir=r2/ck
mkdir -p r3 scratch3 && ln -s "$WORK/victim.txt" scratch3/.lock-offload-rank0
refused r3 "scratch3/.lock-offload-rank0" --set train.offload=nvme --set train.offload_dir=scratch3
mkdir -p r4 && ln -s "$WORK/victim.txt" r4/metrics.jsonl
refused r4 "r4/metrics.jsonl"
echo "ok: locks (run, checkpoint, offload) and metrics.jsonl refuse a planted link by name, exit 2"

# Replaced, never followed: the run goes on.
mkdir -p r5/checkpoints r5/heartbeat
for f in r5/checkpoints/step_00000001.h5.tmp r5/checkpoints/step_00000002.h5.tmp \
         r5/checkpoints/latest.tmp r5/heartbeat/rank-0.tmp r5/trace-rank0.json; do
  ln -s "$WORK/victim.txt" "$f"
done
run_mpi 1 train "$DECK" "${common[@]}" --set run.dir=r5 --set checkpoint.every=1 \
  --set run.trace=true --set run.watchdog_s=30 >r5.log 2>&1 || { cat r5.log; fail "r5 failed"; }
victim_intact "checkpoint, latest, heartbeat and trace .tmp links"
[ -f r5/checkpoints/step_00000002.h5 ] && [ ! -L r5/trace-rank0.json ] ||
  fail "the run did not write its own files in the links' place"
echo "ok: a checkpoint's, latest's and a heartbeat's .tmp and a trace replace a planted link, never follow it"

# The job scripts' records.
source "$SOURCE_DIR/jobs/recovery.sh"
mkdir -p r6 && ln -s "$WORK/victim.txt" r6/restarts.log && ln -s "$WORK/victim.txt" r6/failure-restarts
run_file r6/restarts.log ">>" "a line" 2>err.txt && fail "run_file wrote through a link"
run_file r6/failure-restarts ">" 1 2>>err.txt && fail "run_file replaced through a link"
grep -q "not a regular file" err.txt || fail "run_file did not say why"
victim_intact "restarts.log / failure-restarts"
echo "ok: the job scripts' restarts.log and failure-restarts refuse a planted link"
# A count file holding shell code (arithmetic on its text would run it),
# and one through a link: read as 0, nothing run.
mkdir -p r7 && printf 'a[$(touch %s/ran)]\n' "$WORK" >r7/failure-restarts
ln -s "$WORK/victim.txt" r7/watchdog-requeues
[ "$(run_count r7/failure-restarts 2>err.txt)" = 0 ] || fail "a count file of shell code did not read as 0"
grep -q "does not hold a count" err.txt || fail "run_count did not say why"
[ "$(run_count r7/watchdog-requeues)" = 0 ] || fail "a count read through a link"
[ ! -e "$WORK/ran" ] || fail "a count file's text was run"
echo 4 >r7/exclusion-requeues
[ "$(run_count r7/exclusion-requeues)" = 4 ] || fail "a count of 4 did not read as 4"
echo "ok: the job scripts' counts read digits only, never through a link"
