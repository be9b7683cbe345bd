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
