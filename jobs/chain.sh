#!/usr/bin/env bash
# Submits one training run as SEGMENTS batch jobs chained with afterany: each
# starts when the previous ends (however it ends) and resumes from `latest`.
# Each segment stops at its time limit (the program checkpoints first), or,
# with STEPS_PER_SEGMENT, after that many more steps.
#   SEGMENTS=3  STEPS_PER_SEGMENT=  SBATCH_ARGS=""  plus train.sbatch's
#   parameters (DECK, RUN_DIR, MPIFORMER_ARGS, ...), passed through.
# Prints the job ids, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
SEGMENTS=${SEGMENTS:-3}
STEPS_PER_SEGMENT=${STEPS_PER_SEGMENT:-}
SBATCH_ARGS=${SBATCH_ARGS:-}
base_args=${MPIFORMER_ARGS:-}
export DECK=${DECK:-inputs/tiny.toml}
export RUN_DIR=${RUN_DIR:-runs/chain}
prev=
for i in $(seq 1 "$SEGMENTS"); do
  args=$base_args
  [ -n "$STEPS_PER_SEGMENT" ] && args="$args --set train.stop_at=$((i * STEPS_PER_SEGMENT))"
  # shellcheck disable=SC2086  # SBATCH_ARGS is a list of words by design
  id=$(MPIFORMER_ARGS="$args" sbatch --parsable ${prev:+--dependency=afterany:$prev} \
         --job-name="mpiformer-seg$i" $SBATCH_ARGS jobs/train.sbatch)
  echo "${id%%;*}"
  prev=${id%%;*}
done
