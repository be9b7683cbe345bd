#!/usr/bin/env bash
# A rank that is alive but stuck (here stopped with SIGSTOP, as a hung file
# system or a wedged driver would leave it) ends the job within
# [run] watchdog_s plus a few seconds: exit 76, the waiting rank's report
# names what it waits on, and the stopped rank is marked silent. The
# ending rank's offloaded optimizer files (as large as the model) are
# removed on its way out (the stopped one's stay until the next run in the
# directory replaces them: nothing runs in a process SIGKILLed).
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
limit=5
args=(--set train.steps=100000 --set train.log_every=1 --set train.eval_every=0 --set run.dir=w
      --set parallel.dp=2 --set train.micro_batch=8 --set run.watchdog_s=$limit
      --set train.offload=nvme --set train.offload_dir=scratch)
mkdir -p scratch
run_mpi 2 train "$DECK" "${args[@]}" >w.log 2>w.err &
pid=$!
for i in $(seq 1 120); do
  [ "$(grep -c '"loss"' w/metrics.jsonl 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 0.5
done
victim=$(sed -n 's/.* pid \([0-9]*\):.*/\1/p' w/heartbeat/rank-1)
[ -n "$victim" ] || { cat w/heartbeat/rank-1; fail "no pid in rank 1's heartbeat"; }
kill -STOP "$victim"
stopped=$(date +%s)
rc=0
timeout 120 tail --pid="$pid" -f /dev/null || true
wait "$pid" || rc=$?
took=$(($(date +%s) - stopped))
kill -KILL "$victim" 2>/dev/null || true
[ "$rc" -eq 76 ] || { cat w.log w.err; fail "exit $rc, expected 76 (the watchdog)"; }
grep -q "mpiformer: watchdog: rank 0 .* over its limit of $limit.0 s" w.err ||
  { cat w.err; fail "no report from rank 0"; }
grep -qE "waiting for (the 2 replicas of stage 0|every rank)" w.err || { cat w.err; fail "the report does not say what rank 0 waits on"; }
grep -q "rank 1: host .* pid $victim: .*SILENT" w.err || { cat w.err; fail "rank 1 not marked silent"; }
[ "$took" -le $((limit + 15)) ] || fail "the job took $took s to end after the stop (limit $limit s)"
! ls scratch/mpiformer-offload.rank0.* >/dev/null 2>&1 ||
  { ls -la scratch; fail "the watchdog's rank left its offloaded optimizer files behind"; }
grep -E "mpiformer: watchdog|^  rank" w.err
echo "ok: a stopped rank ended the job in $took s (limit $limit s) with exit 76 and the report"
