#!/usr/bin/env bash
# bench/gpu-check.sh rehearsed on the host (MPIFORMER_REHEARSE_GPU=1), held
# to the lent GPU machine's limits (the device tool's README): at most 8
# files come back from $OUT, no more than 2 folders down, named in letters,
# digits, '.', '_' and '-'; only the last 12 KB of output is sure to come
# back, so the summary must be the last thing printed; the whole check ends
# before its DEADLINE. Then a phase made to overrun its budget: it must be
# reported TIMEOUT, the check must still pack and print its summary, and
# nothing the phase started (mpirun, its ranks) may be left running.
source "$(dirname "$0")/../e2e/lib.sh"
CHECK="$SOURCE_DIR/bench/gpu-check.sh"
DEADLINE=${DEADLINE:-430}

# limits OUT STDOUT: the files and the output's end as the device returns them.
limits() {
  local out=$1 stdout=$2 n
  n=$(find "$out" -type f | wc -l)
  [ "$n" -le 8 ] || { find "$out"; fail "$n files under \$OUT (at most 8 come back)"; }
  find "$out" -mindepth 1 | while read -r f; do
    rel=${f#"$out"/}
    [ "$(tr -cd / <<<"$rel" | wc -c)" -le 2 ] || fail "$rel is more than 2 folders down"
    [[ "$(basename "$rel")" =~ ^[A-Za-z0-9._-]+$ ]] || fail "$rel: a name the device would not return"
  done
  [ -f "$out/gpu-check-logs.tar.gz" ] || fail "no gpu-check-logs.tar.gz"
  [ "$(du -k "$out/gpu-check-logs.tar.gz" | cut -f1)" -le 16384 ] || fail "the archive is over 16 MiB"
  tar -tzf "$out/gpu-check-logs.tar.gz" | has "logs/summary.txt" || fail "the archive lacks the summary"
  # The summary, whole, ends the output.
  local lines
  lines=$(wc -l <"$out/summary.txt")
  [ "$lines" -ge 3 ] || fail "a summary of $lines lines"
  diff <(tail -n "$lines" "$stdout") "$out/summary.txt" >/dev/null ||
    { tail -n "$lines" "$stdout"; fail "the summary is not the last thing printed"; }
  [ "$(tail -c 12000 "$stdout" | grep -c "gpu-check:")" -ge 1 ] || fail "the verdict is not in the last 12 KB"
}

# 1. The whole check at small shapes: passes, in time, within the limits.
start=$SECONDS
OUT=$WORK/out DEADLINE=$DEADLINE bash "$CHECK" >check.out 2>&1 || { cat check.out; fail "gpu-check rehearsal failed"; }
took=$((SECONDS - start))
limits "$WORK/out" check.out
[ "$took" -le $((DEADLINE + 10)) ] || fail "the check took $took s, over its DEADLINE of $DEADLINE s"
grep -q "every phase passed" "$WORK/out/summary.txt" || fail "no verdict in the summary"
for p in "0. preflight" "1. bench gpt2-124m" "2. gpt2-124m" "2b. gpt2-124m fp16" "2c. offload host" "2d. async checkpoints" \
         "3. llama-160m" "3b. llama-160m MoE" "4. kernel, stage and comms tests"; do
  grep -q "^$p.* pass " "$WORK/out/summary.txt" || { cat "$WORK/out/summary.txt"; fail "phase $p did not pass"; }
done
grep -q "threads [0-9]" "$WORK/out/summary.txt" || fail "no run's thread count in the summary"
grep -q "^gpt2-124m" "$WORK/out/table.txt" || fail "no benchmark row in table.txt"
echo "ok: the rehearsal passed in $took s; $(find "$WORK/out" -type f | wc -l) files back, summary last"

# 2. A phase past its budget: the comparison on the full gpt2-124m (a few
# seconds to start on the host) given 10 s, 5 for each run.
mkdir -p "$WORK/t2"
start=$SECONDS
if TMPDIR=$WORK/t2 OUT=$WORK/out2 BENCH=0 FP16=0 OFFLOAD=0 ASYNC=0 LLAMA=0 MOE=0 TESTS=0 BUDGET_compare=10 \
   CMP_SEQ=1024 CMP_MB=2 TRAIN_EXTRA=" " bash "$CHECK" >check2.out 2>&1; then
  cat check2.out
  fail "a check whose phase timed out exited 0"
fi
took=$((SECONDS - start))
limits "$WORK/out2" check2.out
grep -q "^2. gpt2-124m.* TIMEOUT " "$WORK/out2/summary.txt" ||
  { cat "$WORK/out2/summary.txt"; fail "the overrun phase is not reported TIMEOUT"; }
[ "$took" -le 40 ] || fail "a 10 s phase held the check for $took s"
# Nothing started under that check's work folder may still run.
sleep 1
for p in /proc/[0-9]*; do
  cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
  case $cwd in "$WORK/t2"*)
    fail "left running after the check: $(tr '\0' ' ' <"$p/cmdline") (pid ${p#/proc/})" ;;
  esac
done
echo "ok: a phase past its budget reported TIMEOUT in $took s, nothing left running"
