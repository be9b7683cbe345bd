#!/usr/bin/env bash
# jobs/plot-metrics.py on real runs: a run stopped and resumed in its
# directory (two segments) and a second run overlaid give a PNG that
# matplotlib reads back at the size drawn; a directory without metrics, or
# with no step in them, is refused with a message and exit 2.
source "$(dirname "$0")/lib.sh"
PY=${PYTHON_MATPLOTLIB:-/usr/bin/python3}
"$PY" -c "import matplotlib" 2>/dev/null || fail "$PY has no matplotlib (.ci/deps.sh installs python3-matplotlib)"
PLOT="$SOURCE_DIR/jobs/plot-metrics.py"
prep_sample_data
common=(--set train.steps=6 --set train.global_batch=16 --set train.micro_batch=16
        --set train.eval_every=3 --set train.eval_batches=1)
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set run.dir=a --set train.stop_at=3 >a1.log 2>&1
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set run.dir=a >a2.log 2>&1
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set run.dir=b --set train.lr=1e-3 >b.log 2>&1
"$PY" "$PLOT" a >plot1.txt || fail "plot of one run"
grep -q "wrote a/metrics.png" plot1.txt || fail "no output named"
# The run's goodput over its two launches, from its last record.
grep -qE "^plot-metrics: a: goodput [0-9.]+% \(.* over 2 launch\(es\)" plot1.txt ||
  { cat plot1.txt; fail "no goodput of the two launches"; }
"$PY" "$PLOT" a b --output both.png >/dev/null || fail "plot of two runs"
"$PY" - a/metrics.png both.png <<'PY'
import sys
import matplotlib.image as img
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    h, w = img.imread(path).shape[:2]
    assert (w, h) == (1100, 700), (path, w, h)  # 11 x 7 inches at 100 dpi
print("png: both pictures read back, 1100 x 700")
PY
mkdir empty
rc=0
"$PY" "$PLOT" empty >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "empty: no metrics.jsonl" err.txt || { cat err.txt; fail "an empty directory was not refused (exit $rc)"; }
echo '{"memory_predicted": []}' >empty/metrics.jsonl
rc=0
"$PY" "$PLOT" empty >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "no step lines" err.txt || { cat err.txt; fail "metrics without steps were not refused (exit $rc)"; }
echo "ok: refusals named"
