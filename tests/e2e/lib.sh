# Shared by the end-to-end tests: a scratch directory, the sample data, and
# a launcher that works as root and on few cores. Sourced, not run.
set -euo pipefail
: "${MPIFORMER:?path to the mpiformer binary}"
: "${SOURCE_DIR:?path to the source tree}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mpiformer-e2e-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Byte-level Tiny Shakespeare with a 10% validation split, in $WORK/data.
prep_sample_data() {
  mkdir -p data
  "$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 \
    --output data/tinyshakespeare_byte.h5 "$SOURCE_DIR/inputs/tinyshakespeare.txt" >/dev/null
}

# run_mpi NP ARGS...: the binary under mpirun with NP ranks.
run_mpi() {
  local np=$1
  shift
  mpirun -np "$np" "$MPIFORMER" "$@"
}

# The losses of a metrics file, one per line (timings stripped).
losses_of() { grep -o '"loss": [^,]*' "$1"; }
