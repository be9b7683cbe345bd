#!/usr/bin/env bash
# The same deck and seed give bit-identical losses; another seed does not.
source "$(dirname "$0")/lib.sh"
prep_sample_data
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3)
for r in a b; do
  run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set run.dir="$WORK/$r" >/dev/null
done
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set train.seed=7 \
  --set run.dir="$WORK/c" >/dev/null
[ "$(losses_of a/metrics.jsonl | wc -l)" -eq 6 ] || fail "expected 6 logged losses"
diff <(losses_of a/metrics.jsonl) <(losses_of b/metrics.jsonl) || fail "same seed, different losses"
diff <(grep val_loss a/metrics.jsonl) <(grep val_loss b/metrics.jsonl) || fail "same seed, different val loss"
if diff -q <(losses_of a/metrics.jsonl) <(losses_of c/metrics.jsonl) >/dev/null; then
  fail "a different seed gave identical losses"
fi
echo "identical with the same seed, different with another"
