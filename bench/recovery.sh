#!/usr/bin/env bash
# How long a job is down after a rank dies, under jobs/local.sh: a 2-rank
# run (DECK, default the tiny deck) checkpoints every CKPT steps; one rank
# is SIGKILLed after step KILL_AT; the script restarts the launch. Prints
# the seconds from the kill to the launch's end (detection: mpirun ends
# the other rank), to the restart's first step (back to training), and the
# steps redone (logged after the last checkpoint). RESTART_BACKOFF_S (the
# wait before a restart, default 1 here, 10 in the job scripts) is part of
# the second figure.
#   DECK=inputs/tiny.toml  KILL_AT=13  CKPT=10  RESTART_BACKOFF_S=1
source "$(dirname "$0")/lib.sh"
DECK=${DECK:-inputs/tiny.toml}
KILL_AT=${KILL_AT:-13}
CKPT=${CKPT:-10}
export RESTART_BACKOFF_S=${RESTART_BACKOFF_S:-1} MPIFORMER=$BIN OMPI_MCA_rmaps_base_oversubscribe=1
prep_corpus byte
out=$(mktemp -d /tmp/mpiformer-recovery-XXXXXX)
trap 'rm -rf "$out"' EXIT
now() { date +%s.%N; }
steps() {
  local n
  n=$(grep -c '"loss"' "$out/run/metrics.jsonl" 2>/dev/null) || true
  echo "${n:-0}"
}
jobs/local.sh "$DECK" --set parallel.dp=2 --set train.steps=$((KILL_AT + 3 * CKPT)) --set train.log_every=1 \
  --set train.eval_every=0 --set checkpoint.every="$CKPT" --set run.dir="$out/run" >"$out/log" 2>&1 &
pid=$!
until [ "$(steps)" -ge "$KILL_AT" ]; do sleep 0.05; done
kill -KILL "$(pgrep -x mpiformer | tail -1)"
t_kill=$(now)
before=$(steps)
until grep -q "launch ended" "$out/log"; do sleep 0.05; done
t_ended=$(now)
until [ "$(steps)" -gt "$before" ]; do sleep 0.05; done
t_back=$(now)
wait "$pid" || { cat "$out/log"; echo "recovery bench: the run did not finish" >&2; exit 1; }
lost=$(sed -n 's/.*; \([0-9]*\) step(s) since the last checkpoint are redone.*/\1/p' "$out/log" | head -1)
python3 - "$t_kill" "$t_ended" "$t_back" "$lost" "$RESTART_BACKOFF_S" <<'PY'
import sys
kill, ended, back, lost, backoff = map(float, sys.argv[1:])
print(f"recovery: kill -> launch ended {ended - kill:.2f} s; kill -> training again {back - kill:.2f} s "
      f"(backoff {backoff:.0f} s included); {lost:.0f} step(s) redone")
PY
