#!/usr/bin/env bash
# How accurate `mpiformer plan` is on this machine: every layout it can run
# (1-4 ranks; the tiny deck and gpt2-124m at seq 256; both schedules; each
# ZeRO stage and recomputation), predicted (`plan --as-given --json` with a
# machine file `calibrate` measured first, under mpirun as the runs are)
# against measured by the trainer itself:
#  - step time: the median step_ms of the steps after the first;
#  - memory: each rank's resident-memory growth over its baseline
#    (memory_measured, the same number the run prints at its end) against
#    its stage's prediction plus the machine file's runtime bytes.
# Targets (issue 15): step time within 15%, memory within 10%, every row.
# 4 ranks on this 2-core machine are oversubscribed: the plan is told
# (--ranks-per-node 4) and shares the cores between them.
#   OUT=bench-out STEPS_TINY=12 STEPS_GPT2=4 PRESET=cpu ROWS=all|quick
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/plan_accuracy
STEPS_TINY=${STEPS_TINY:-12}
STEPS_GPT2=${STEPS_GPT2:-4}
ROWS=${ROWS:-all}
mkdir -p "$OUT"
prep_corpus byte
prep_corpus gpt2
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "mpiformer $rev, $(date -u +%F), host back end, OPENBLAS_NUM_THREADS=1"

# The decks as run: tiny as shipped; GPT-2 small at seq 256, global batch
# 8, written out so calibrate measures the same shapes.
sed -e 's/^seq_len = .*/seq_len = 256/' -e 's/^global_batch = .*/global_batch = 8/' \
  -e 's/^micro_batch = .*/micro_batch = 2/' \
  -e 's|^train = .*|train = "data/tinyshakespeare_gpt2.h5"|' inputs/gpt2-124m.toml >"$OUT/gpt2-s256.toml"
sed -e 's|^train = .*|train = "data/tinyshakespeare_byte.h5"|' inputs/tiny.toml >"$OUT/tiny.toml"
tiny=("$OUT/tiny.toml")
gpt2=("$OUT/gpt2-s256.toml")
common=(--set train.log_every=1 --set train.eval_every=0 --set data.val='""'
        --set run.peak_tflops=1 --set checkpoint.resume=never --set checkpoint.every=0)

machine="$OUT/machine.toml"
mpirun -np 2 "$BIN" calibrate </dev/null "$OUT/tiny.toml" "$OUT/gpt2-s256.toml" --max-tp 2 \
  --name "this 2-core machine" --output "$machine" >"$OUT/calibrate.log" 2>&1 ||
  { cat "$OUT/calibrate.log"; exit 1; }
tail -1 "$OUT/calibrate.log"

# model dp pp tp micro_batch zero recompute schedule
rows_all="tiny 1 1 1 16 0 none 1f1b
tiny 1 1 1 16 0 full 1f1b
tiny 1 1 1 4 0 attention 1f1b
tiny 2 1 1 16 0 none 1f1b
tiny 2 1 1 8 1 none 1f1b
tiny 2 1 1 8 2 none 1f1b
tiny 2 1 1 8 3 full 1f1b
tiny 1 2 1 4 0 none 1f1b
tiny 1 2 1 4 0 none gpipe
tiny 1 1 2 16 0 none 1f1b
tiny 4 1 1 8 0 none 1f1b
tiny 2 2 1 4 1 none 1f1b
tiny 1 4 1 2 0 none gpipe
tiny 1 2 2 4 0 attention 1f1b
gpt2 1 1 1 2 0 none 1f1b
gpt2 2 1 1 2 0 none 1f1b
gpt2 2 1 1 2 3 none 1f1b
gpt2 1 2 1 1 0 none 1f1b
gpt2 1 1 2 2 0 none 1f1b
gpt2 1 1 1 2 0 full 1f1b
gpt2 2 1 2 1 1 attention 1f1b"
rows_quick=$(printf '%s\n' "$rows_all" | grep -E '^tiny (1 1 1 16 0 none|2 1 1 16|1 2 1 4 0 none 1f1b)')
[ "$ROWS" = quick ] && rows=$rows_quick || rows=$rows_all

echo
echo "| model | dp pp tp | micro-batch | zero | recompute | schedule | step ms predicted | measured | error | MB per rank predicted | measured | error |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
: >"$OUT/rows.txt"
while read -r model dp pp tp mb zero rc sched; do
  n=$((dp * pp * tp))
  if [ "$model" = tiny ]; then deck=("${tiny[@]}"); steps=$STEPS_TINY; else deck=("${gpt2[@]}"); steps=$STEPS_GPT2; fi
  lay=(--set parallel.dp="$dp" --set parallel.pp="$pp" --set parallel.tp="$tp"
       --set train.micro_batch="$mb" --set parallel.zero="$zero" --set train.recompute="$rc"
       --set parallel.schedule="$sched" --set train.steps="$steps")
  name="${model}_${dp}_${pp}_${tp}_${mb}_${zero}_${rc}_${sched}"
  dir="$OUT/$name"
  rm -rf "$dir"
  "$BIN" plan "${deck[@]}" "${lay[@]}" --machine "$machine" --as-given --json \
    --ranks-per-node "$((n > 2 ? n : 2))" --explain "$OUT/$name.predicted-trace.json" \
    >"$OUT/$name.plan.json" </dev/null || { cat "$OUT/$name.plan.json"; exit 1; }
  mpirun --oversubscribe -np "$n" "$BIN" train "${deck[@]}" "${lay[@]}" "${common[@]}" \
    --set run.dir="$dir" >"$dir.log" 2>&1 </dev/null || { tail -20 "$dir.log"; exit 1; }
  /usr/bin/python3 - "$OUT/$name.plan.json" "$dir/metrics.jsonl" "$machine" "$model" "$dp $pp $tp" \
    "$mb" "$zero" "$rc" "$sched" <<'PY' | tee -a "$OUT/rows.txt"
import json, re, sys, statistics
plan = json.load(open(sys.argv[1]))["layouts"][0]
recs = [json.loads(l) for l in open(sys.argv[2])]
runtime = plan["runtime"]  # what plan adds for the libraries beyond the accounting
steps = [r["step_ms"] for r in recs if "step_ms" in r][1:]
measured_ms = statistics.median(steps)
pred_ms = plan["step_s"] * 1e3
worst = None
for r in [r for r in recs if "memory_measured" in r][0]["memory_measured"]:
    pred = plan["memory"][r["stage"]] + runtime
    err = (pred - r["peak_growth"]) / r["peak_growth"]
    if worst is None or abs(err) > abs(worst[2]):
        worst = (pred, r["peak_growth"], err)
t_err = (pred_ms - measured_ms) / measured_ms
print(f"| {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} | {sys.argv[7]} | {sys.argv[8]} | {sys.argv[9]} "
      f"| {pred_ms:.1f} | {measured_ms:.1f} | {100 * t_err:+.1f}% "
      f"| {worst[0] / 1e6:.1f} | {worst[1] / 1e6:.1f} | {100 * worst[2]:+.1f}% |")
PY
done <<<"$rows"

/usr/bin/python3 - "$OUT/rows.txt" <<'PY'
import re, sys
rows = [l.strip() for l in open(sys.argv[1]) if l.startswith("|")]
def errs(l):
    e = re.findall(r"([+-]\d+\.\d)%", l)
    return abs(float(e[0])), abs(float(e[1]))
t = max(rows, key=lambda l: errs(l)[0]); m = max(rows, key=lambda l: errs(l)[1])
ok_t = sum(errs(l)[0] <= 15 for l in rows); ok_m = sum(errs(l)[1] <= 10 for l in rows)
print(f"\nstep time within 15%: {ok_t} of {len(rows)} rows; worst {errs(t)[0]:.1f}%: {t}")
print(f"memory within 10%: {ok_m} of {len(rows)} rows; worst {errs(m)[1]:.1f}%: {m}")
PY
