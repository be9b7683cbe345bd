#!/usr/bin/env bash
# Sequence parallelism's memory on this machine (host back end, one BLAS
# thread per rank), measured by the trainer itself: gpt2-124m at tp = 2 and
# 4, each without and with [parallel] sequence_parallel, one micro-batch of
# MB sequences per step:
#  - predicted bytes per rank (memory_predicted, stage 0): the total and the
#    activations (the kept slot) with the backward scratch;
#  - measured: the largest rank's growth of peak resident memory
#    (memory_measured), so the saving measured is the difference of two
#    runs' peaks against the predicted difference;
#  - the bytes each rank sent to its tensor group per step (tp_sent_mb) and
#    tokens/s (mean of the steps after the first; tp = 4 oversubscribes the
#    2 cores, so its speed says little).
#   MODEL=inputs/gpt2-124m.toml SEQ=256 MB=4 STEPS=2 OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/sequence_parallel
MODEL=${MODEL:-inputs/gpt2-124m.toml}
SEQ=${SEQ:-256}
MB=${MB:-4}
STEPS=${STEPS:-2}
mkdir -p "$OUT"
prep_corpus gpt2
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), $MODEL seq $SEQ, micro-batch $MB"
common=(--set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.global_batch="$MB"
        --set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set checkpoint.resume=never
        --set checkpoint.every=0 --set checkpoint.at_end=false)

echo "| tp | sequence parallel | predicted MB/rank | activations + scratch, predicted MB | measured MB/rank | vs predicted | sent MB/step/rank (tp) | tokens/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for tp in 2 4; do
  declare -A pred_of meas_of
  for sp in false true; do
    dir="$OUT/tp${tp}_sp_$sp"
    rm -rf "$dir"
    mpirun --oversubscribe -np "$tp" "$BIN" train "$MODEL" "${common[@]}" --set parallel.tp="$tp" \
      --set parallel.sequence_parallel="$sp" --set run.dir="$dir" >"$dir.log" 2>&1 ||
      { tail -20 "$dir.log"; exit 1; }
    read -r pred act meas sent tps < <(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
p = [r["memory_predicted"] for r in recs if "memory_predicted" in r][0][0]
meas = max(m["peak_growth"] for r in recs if "memory_measured" in r for m in r["memory_measured"])
steps = [r for r in recs if "tokens_per_s" in r]
later = steps[1:] or steps
tps = sum(r["tokens_per_s"] for r in later) / len(later)
print(f"{p['total'] / 1e6:.0f} {(p['activations'] + p['scratch']) / 1e6:.0f} {meas / 1e6:.0f} "
      f"{steps[-1].get('tp_sent_mb', 0.0):.1f} {tps:.1f}")
PY
)
    pred_of[$sp]=$pred
    meas_of[$sp]=$meas
    printf "| %d | %s | %s | %s | %s | %+.1f%% | %s | %s |\n" "$tp" "$sp" "$pred" "$act" "$meas" \
      "$(awk -v m="$meas" -v p="$pred" 'BEGIN{print 100*(m-p)/p}')" "$sent" "$tps"
  done
  echo "| $tp | saving | $((pred_of[false] - pred_of[true])) | | $((meas_of[false] - meas_of[true])) | | | |"
  unset pred_of meas_of
done
