#!/usr/bin/env bash
# The tiny deck, shortened to 80 steps at half its batch (16 sequences, for
# the suite's time: one rank, fp32, on the BLAS's sgemm), must bring the
# validation loss below 2.8 nats. Why that bound: ln(256) = 5.55 is a
# uniform guess and 3.31 is the corpus's unigram (letter-frequency)
# entropy, so 2.8 shows the model uses context; this run reaches 2.53 at
# step 80 (the deck's batch of 32: about 2.5), which leaves margin for
# rounding differences across machines and BLAS builds.
source "$(dirname "$0")/lib.sh"
export MEASURE_PEAK=1  # this test checks the measured peak and MFU
prep_sample_data
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" --set train.steps=80 --set train.global_batch=16 --set train.eval_every=40 \
  --set run.dir="$WORK/run" | tee out.txt
val=$(sed -n 's/^final val loss \([0-9.]*\) .*/\1/p' out.txt)
[ -n "$val" ] || fail "no final validation loss in the log"
awk -v v="$val" 'BEGIN { exit !(v < 2.8) }' || fail "val loss $val is not below 2.8"
grep -q "peak [0-9.]* GFLOP/s over 1 rank(s) (sgemm 2048^3, best of 5, measured now" out.txt ||
  fail "no measured peak in the log"
grep -q "MFU [0-9.]*%" out.txt || fail "no MFU in the step lines"
# The peak is re-measured when an interval would beat it: MFU never reads
# above 100% (it read 105% on this noisy machine once).
python3 - run/metrics.jsonl <<'PY'
import json, sys
mfu = [j["mfu"] for j in map(json.loads, open(sys.argv[1])) if "mfu" in j]
assert mfu and max(mfu) <= 1.0, mfu
PY
[ "$(grep -c '"val_loss"' run/metrics.jsonl)" -eq 2 ] || fail "expected 2 evaluation lines in metrics.jsonl"
[ "$(grep -c '"grad_norm"' run/metrics.jsonl)" -eq 8 ] || fail "expected 8 step lines in metrics.jsonl"
# The memory accounting: predicted per stage at the start, measured at the
# end (the figures' accuracy is a benchmark's business, not a test's).
python3 - run/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
pred = [r["memory_predicted"] for r in recs if "memory_predicted" in r]
meas = [r["memory_measured"] for r in recs if "memory_measured" in r]
assert len(pred) == 1 and len(pred[0]) == 1, pred
p = pred[0][0]
# (On the host the saves' buffers are the rank's memory too: a save's
# write and read-back while it runs.)
parts = (p["parameters"] + p["gradients"] + p["optimizer"] + p["activations"] + p["comm"] +
         p["scratch"] + p["workspace"] + p["checkpoint_io"])
assert abs(parts - p["total"]) <= 1 and p["activations"] == p["slots"] * p["per_slot"], p
assert len(meas) == 1 and meas[0][0]["predicted"] == p["total"] and meas[0][0]["peak_growth"] > 0, meas
PY
echo "val loss $val < 2.8"
