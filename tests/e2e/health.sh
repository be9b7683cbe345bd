#!/usr/bin/env bash
# [run] health_check: a rank made slow for real (pinned to a core that seven
# busy loops share, its neighbour alone on the other) is named with its
# host before the first step; "warn" goes on, "stop" ends the launch with
# exit 75 and nothing trained; the host goes to <run.dir>/unhealthy-hosts;
# during the run, the same rank is named a straggler ([run] straggler_every),
# also where the step waits for it inside (buckets in flight, ZeRO).
# Two ranks on their own cores pass. One node under "auto": no check.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
[ "$(nproc)" -ge 2 ] || { echo "skipped: needs 2 cores"; exit 0; }
args=(--set parallel.dp=2 --set train.steps=2 --set train.log_every=1 --set train.eval_every=0 --set run.peak_tflops=1)
# Each rank on a core of its own: rank r on core r, or on core 1 - r with
# SWAP=1.
pinned() {  # RUN_DIR ARGS...
  local dir=$1
  shift
  mpirun -np 2 --bind-to none -x SWAP="${SWAP:-0}" \
    bash -c 'exec taskset -c "$(((OMPI_COMM_WORLD_RANK + SWAP) % 2))" "$0" "$@"' \
    "$MPIFORMER" train "$DECK" "${args[@]}" --set run.dir="$dir" "$@"
}
host=$(hostname)

# A fair pair passes. Each rank's rate is its best of a few GEMMs, yet a
# virtual machine's core can run at 0.6 of its neighbour's for half a
# minute (rank 1's core at 15 against 25 GFLOP/s in two tries running in
# one CI run; 2 tries in 8 here named a rank, both times the one on core
# 1). Such a core is slow, and naming it is the check's job. So a try
# that names a rank must be right by its own printed rates, and the pair
# passes when a try names no one, or when two tries running, with the
# ranks' cores swapped between them, name the rank on the same core: the
# core's, not the check's. A check biased towards a rank names the other
# core after the swap, and fails after four tries.
fair() {  # RUN_DIR: 0 when no rank is named
  pinned "$1" --set run.health_check=on >"$1.log" 2>&1 || { cat "$1.log"; fail "two ranks on their own cores"; }
  grep -q "^health: 2 rank(s): GEMM .* GFLOP/s (median .*), 1 link(s) .* GB/s (median .*); every rank within 0.80 of the median" "$1.log" &&
    [ ! -e "$1/unhealthy-hosts" ]
}
# The rank a try named, after checking the naming against the try's own
# rates (two ranks: the median is their mean; the slower is named when
# below 0.80 of it). Prints nothing where it named no one.
named_rank() {  # LOG
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^health: 2 rank\(s\): GEMM ([0-9.]+)-([0-9.]+) GFLOP/s \(median ([0-9.]+)\)",
              text, re.M)
assert m, "no health line"
lo, hi, med = map(float, m.groups())
assert abs((lo + hi) / 2 - med) <= 0.1, ("the median of two is their mean", lo, hi, med)
named = re.findall(r"warning: health: rank (\d) on \S+: GEMM ([0-9.]+) GFLOP/s", text)
# Printed to 0.1 GFLOP/s: a rate within that of the bound proves nothing.
if lo < 0.8 * med - 0.1:
    assert len(named) == 1 and float(named[0][1]) == lo, \
        ("the slower rank not named alone", named, lo, med)
elif lo > 0.8 * med + 0.1:
    assert not named, ("a rank named within 0.80 of the median", named, lo, med)
if named:
    print(named[0][0])
PY
}
passed=
last_core=
for try in 1 2 3 4; do
  swap=$(((try + 1) % 2))
  SWAP=$swap fair "fair$try" && { passed=1; break; }
  rank=$(named_rank "fair$try.log") ||
    { cat "fair$try.log"; fail "the health check's verdict against its own rates"; }
  [ -n "$rank" ] || { cat "fair$try.log"; fail "a fair pair: no rank named, yet no pass"; }
  core=$(((rank + swap) % 2))
  echo "note: try $try named rank $rank, on core $core: $(grep "^health:" "fair$try.log")"
  if [ "$core" = "$last_core" ]; then
    passed=1
    echo "note: core $core named with the ranks swapped too: the core is slow"
    break
  fi
  last_core=$core
done
[ -n "$passed" ] || fail "a fair pair: a rank named in four tries, not following a core"

# Seven busy loops: rank 1 gets an eighth of its core. The margin is for
# work on core 0 that is not the test's (the machine's own, or a CI
# runner's): it slows the rank it is compared with. With three loops (a
# quarter) one CI run named the straggler at step 12 and another at step
# 9, not at step 6: rank 0 computed 64 ms a step there against 17.5 ms on
# a quiet machine, so rank 1 stood at 1.30x the median, not 1.65x. Here,
# with two more busy loops on core 0, three left rank 1 unnamed by both
# checks (GEMM 0.84 of the median); seven named it by both (0.54, and
# 1.47x at step 6). With one loop rank 1's best GEMM of a few (the
# scheduler's shares are uneven over a short product) came out at 0.84 of
# the median once in CI.
hogs=()
for _ in 1 2 3 4 5 6 7; do
  taskset -c 1 bash -c 'while :; do :; done' &
  hogs+=($!)
done
# (lib.sh's trap removes $WORK: kept.)
trap 'kill "${hogs[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
# One run for both checks: the health check's probe takes the slowed rank
# about 20 s on a CPU whose BLAS runs generic kernels, and the straggler
# needs steps after it. Small steps (SMALL_BATCH) still name it: with an
# eighth of its core, the slowed rank computed 1.83x the two ranks'
# median a step (seen here), against the 1.25x bound.
# shellcheck disable=SC2086  # SMALL_BATCH's words are the arguments
pinned slow --set run.health_check=on --set train.steps=12 --set run.straggler_every=3 $SMALL_BATCH \
  >slow.log 2>&1 || { cat slow.log; fail "warn: the run did not go on"; }
grep -q "warning: health: rank 1 on $host: GEMM [0-9.]* GFLOP/s, 0\.[0-7][0-9] of the median" slow.log ||
  { cat slow.log; fail "the slowed rank was not named"; }
grep -q "1 rank(s) below 0.80 of the median" slow.log || { cat slow.log; fail "summary"; }
grep -q "^$host [0-9]* rank 1 on $host: GEMM" slow/unhealthy-hosts || { cat slow/unhealthy-hosts; fail "unhealthy-hosts"; }
python3 - slow/metrics.jsonl <<'PY'
import json, sys
h = [json.loads(l)["health"] for l in open(sys.argv[1]) if '"health"' in l][0]
assert h["ranks"] == 2 and [b["rank"] for b in h["below"]] == [1], h
assert sum(1 for l in open(sys.argv[1]) if '"loss"' in l) == 12, "warn: the run trained"
PY
# During the run: the same rank's compute time per step, twice running
# above the median by more than 1 / 0.8, is named every window after.
grep -q "warning: straggler: rank 1 on $host computes .* ms a step against the median .* ms (.*x) over the last 3 steps, 2 windows running" slow.log ||
  { cat slow.log; fail "the straggler was not named"; }
python3 - slow/metrics.jsonl <<'PY'
import json, sys
found = [json.loads(l)["straggler"] for l in open(sys.argv[1]) if '"straggler"' in l]
assert found and all(f["rank"] == 1 for f in found), found
assert [f["step"] for f in found][0] == 6 and found[0]["compute_ms"] > 1.25 * found[0]["median_ms"], found
PY
# Where the step itself waits for the slowed rank (a free slot among the
# reductions in flight: many buckets at zero 0; ZeRO's reduce-scatters
# and gathers), the wait is not compute: the same rank is named at step
# 6. Counting those waits as compute left it unnamed (all 12 steps).
for case in "zero0-buckets --set parallel.bucket_mb=0.05" "zero2 --set parallel.zero=2" \
  "zero3 --set parallel.zero=3"; do
  read -r name extra <<<"$case"
  # shellcheck disable=SC2086  # the words are the arguments
  pinned "$name" --set train.steps=6 --set run.straggler_every=3 $SMALL_BATCH $extra \
    >"$name.log" 2>&1 || { cat "$name.log"; fail "$name: the run"; }
  python3 - "$name/metrics.jsonl" "$name" <<'PY' ||
import json, sys
found = [json.loads(l)["straggler"] for l in open(sys.argv[1]) if '"straggler"' in l]
assert found and all(f["rank"] == 1 for f in found), (sys.argv[2], found)
first = found[0]
assert first["step"] == 6 and first["compute_ms"] > 1.25 * first["median_ms"], (sys.argv[2], found)
PY
    { cat "$name.log"; fail "$name: the straggler"; }
done
echo "ok: the straggler named where the step waits for it inside (buckets, zero 2, zero 3)"
rc=0
pinned stop --set run.health_check=on --set run.health_action=stop >stop.log 2>&1 || rc=$?
kill "${hogs[@]}"
[ "$rc" -eq 75 ] || { cat stop.log; fail "stop: exit $rc, expected 75"; }
grep -q "the health check found rank(s) below 0.80 of the median (\[run\] health_action = \"stop\"): rank 1 on $host" stop.log ||
  { cat stop.log; fail "stop: no message naming the rank"; }
! grep -q '"loss"' stop/metrics.jsonl 2>/dev/null || fail "stop: a step was trained"
echo "ok: a slowed rank is named; warn goes on, stop exits 75"

run_mpi 2 train "$DECK" "${args[@]}" --set run.dir=auto >auto.log 2>&1 || { cat auto.log; fail "auto"; }
! grep -q "^health:" auto.log || fail "auto on one node ran the check"
echo "ok: auto skips one node"
