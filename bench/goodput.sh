#!/usr/bin/env bash
# Goodput under failures: a 2-rank run under jobs/local.sh (DECK, default
# the tiny deck at a batch that makes a step about a third of a second
# here) loses a rank to SIGKILL each time it reaches a further KILL_EVERY
# steps; the script restarts it from its last checkpoint. For each
# checkpoint interval in CKPTS, prints the run's own goodput record
# (src/train/goodput.hpp) at the end and the interval Young/Daly's formula
# suggests from the run's save cost and the failure rate it saw
# ([checkpoint] mtbf_hours set to the measured mean time between kills).
# MODES: "sync" and/or "async" ([checkpoint] async); EXTRA: more words for
# every run (later --set win), e.g. a bigger model's shape.
#   DECK=inputs/tiny.toml STEPS=120 KILL_EVERY=33 CKPTS="5 20" MODES=sync
#   RESTART_BACKOFF_S=1 EXTRA=""
source "$(dirname "$0")/lib.sh"
DECK=${DECK:-inputs/tiny.toml}
STEPS=${STEPS:-120}
KILL_EVERY=${KILL_EVERY:-33}
CKPTS=${CKPTS:-5 20}
MODES=${MODES:-sync}
read -r -a extra <<<"${EXTRA:-}"
export RESTART_BACKOFF_S=${RESTART_BACKOFF_S:-1} MPIFORMER=$BIN OMPI_MCA_rmaps_base_oversubscribe=1
export MAX_FAILURE_RESTARTS=$((STEPS / KILL_EVERY + 2))
prep_corpus byte
out=$(mktemp -d /tmp/mpiformer-goodput-XXXXXX)
trap 'rm -rf "$out"' EXIT
last_step() {
  python3 - "$1" <<'PY' 2>/dev/null || echo 0
import json, sys
step = 0
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "loss" in j and "step" in j:
        step = max(step, j["step"])
print(step)
PY
}
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), $DECK, $STEPS steps, a rank killed every $KILL_EVERY new steps"
for mode in $MODES; do
for ckpt in $CKPTS; do
  run="$out/$mode$ckpt"
  args=(--set parallel.dp=2 --set train.steps="$STEPS" --set train.global_batch=64
        --set train.micro_batch=16 --set train.log_every=1 --set train.eval_every=0
        --set checkpoint.every="$ckpt" --set run.dir="$run" --set run.peak_tflops=1
        --set checkpoint.async="$([ "$mode" = async ] && echo true || echo false)" "${extra[@]}")
  start=$(date +%s.%N)
  jobs/local.sh "$DECK" "${args[@]}" >"$out/log$ckpt" 2>&1 &
  pid=$!
  next=$KILL_EVERY kills=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$next" -lt "$STEPS" ] && [ "$(last_step "$run/metrics.jsonl")" -ge "$next" ]; then
      victim=$(pgrep -x mpiformer | tail -1)
      if [ -n "$victim" ]; then
        kill -KILL "$victim"
        kills=$((kills + 1))
        next=$((next + KILL_EVERY))
      fi
    fi
    sleep 0.1
  done
  wait "$pid" || { cat "$out/log$ckpt"; echo "goodput bench: the run did not finish" >&2; exit 1; }
  elapsed=$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)")
  python3 - "$run/metrics.jsonl" "$ckpt" "$kills" "$elapsed" "$mode" <<'PY'
import json, math, sys
path, ckpt, kills, elapsed, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
g = None
for line in open(path):
    j = json.loads(line)
    if "goodput" in j:
        g = j["goodput"]
mtbf = g["wall_s"] / max(kills, 1)
save = g["save_s"] / max(g["saves"], 1)


print(f"{mode:5s} every {ckpt:3d} steps: goodput {100 * g['goodput']:.1f}% of {g['wall_s']:.1f} s over "
      f"{g['launches']} launches ({kills} kills; {elapsed:.1f} s by the clock, between launches "
      f"{g['between_launches_s']:.1f} s); kept steps {g['productive_s']:.1f} s, redone "
      f"{g['lost_s']:.1f} s ({g['steps_redone']} steps), saves {g['save_s']:.1f} s "
      f"({g['saves']}, {save:.3f} s each), start-up {g['startup_s']:.1f} s "
      f"(restore {g['restore_s']:.1f} s); Young/Daly for a failure every {mtbf:.1f} s: "
      f"a save every {math.sqrt(2 * save * mtbf):.1f} s")
PY
done
done
