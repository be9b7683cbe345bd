# Shared by the benchmark scripts: the source tree as the working
# directory, the preset's binary, one BLAS thread per rank, mpirun as root,
# and the sample corpus tokenised on first use. Sourced, not run.
#   PRESET=cpu
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PRESET=${PRESET:-cpu}
BIN=build/$PRESET/app/mpiformer
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p data

# prep_corpus byte|gpt2: data/tinyshakespeare_<tokenizer>.h5 (and _val).
prep_corpus() {
  [ -f "data/tinyshakespeare_$1.h5" ] || "$BIN" prep --tokenizer "$1" --val-fraction 0.1 \
    --output "data/tinyshakespeare_$1.h5" inputs/tinyshakespeare.txt >/dev/null
}

# run_summary DIR KEY: of a run directory's metrics.jsonl, the predicted
# MB of stage 0 (memory_predicted's total), the fullest rank's measured
# peak growth (memory_measured), tokens/s and KEY's value (each a mean of
# the steps after the first, which pays for the start).
run_summary() {
  python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
pred = [r["memory_predicted"] for r in recs if "memory_predicted" in r][0][0]["total"]
meas = max(m["peak_growth"] for r in recs if "memory_measured" in r for m in r["memory_measured"])
steps = [r for r in recs if "tokens_per_s" in r][1:]
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
key = sum(r.get(sys.argv[2], 0.0) for r in steps) / len(steps)
print(f"{pred / 1e6:.0f} {meas / 1e6:.0f} {tps:.1f} {key:.0f}")
PY
}
