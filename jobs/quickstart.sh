#!/usr/bin/env bash
# From a fresh checkout to a trained model: installs the dependencies, builds
# the cpu preset, tokenizes the sample corpus and trains the tiny deck under
# mpirun. Parameters (environment variables, with defaults):
#   DECK=inputs/tiny.toml   the input deck
#   NP=                     MPI ranks (default: the deck's dp x pp)
#   PRESET=cpu              CMake preset to build
#   MPIFORMER_ARGS=""       extra arguments, e.g. "--set train.steps=50"
set -euo pipefail
cd "$(dirname "$0")/.."

DECK=${DECK:-inputs/tiny.toml}
NP=${NP:-}
PRESET=${PRESET:-cpu}
MPIFORMER_ARGS=${MPIFORMER_ARGS:-}

bash .ci/deps.sh
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" --target mpiformer
BIN=build/$PRESET/app/mpiformer

if [ ! -f data/tinyshakespeare_byte.h5 ] || [ ! -f data/tinyshakespeare_byte_val.h5 ]; then
  mkdir -p data
  "$BIN" prep --tokenizer byte --val-fraction 0.1 \
    --output data/tinyshakespeare_byte.h5 inputs/tinyshakespeare.txt
fi

# A fresh run each time (a cluster job would resume instead: resume = "auto").
rc=0
# shellcheck disable=SC2086  # MPIFORMER_ARGS is a list of words by design
env ${NP:+NP=$NP} MPIFORMER=$BIN jobs/local.sh "$DECK" --set checkpoint.resume=never $MPIFORMER_ARGS ||
  rc=$?
# The run's curves, where Debian's python3 has matplotlib (.ci/deps.sh
# installs it): the run directory is the deck's [run] dir unless overridden.
source jobs/recovery.sh
# shellcheck disable=SC2086  # MPIFORMER_ARGS is a list of words by design
run_dir=$(deck_value run dir runs/default "$DECK" $MPIFORMER_ARGS)
if [ -f "$run_dir/metrics.jsonl" ] && /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 jobs/plot-metrics.py "$run_dir" >/dev/null &&
    echo "quickstart: loss, learning rate, tokens/s and MFU are plotted in $run_dir/metrics.png"
fi
exit "$rc"
