#!/usr/bin/env bash
# Tensor parallelism on this machine (host back end, one BLAS thread per
# rank), measured by the trainer itself, gpt2-124m at one global batch:
#  - tokens/s of 2 ranks as tp = 2, dp = 2 and pp = 2 (and of one rank),
#    the mean of the steps after the first;
#  - the share of the step time in the tensor group's all-reduces
#    (tp_reduce_fraction: the host time inside them, from the same spans
#    the trace shows) and the bytes each rank sent to the group per step
#    (tp_sent_mb, counted from the all-reduces issued, ring model) against
#    Megatron's count: per micro-batch and layer two all-reduces of
#    B x T x C forward and two backward, plus the embedding's, the head's
#    input gradient's and the cross-entropy's 3 values per token;
#  - the predicted bytes per rank (memory_predicted, stage 0).
# On 2 cores the ranks of every 2-rank layout share the machine; an
# all-reduce here is a copy through shared memory, not a network.
#   MODEL=inputs/gpt2-124m.toml SEQ=256 GLOBAL=4 STEPS=3 OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/tensor_parallel
MODEL=${MODEL:-inputs/gpt2-124m.toml}
SEQ=${SEQ:-256}
GLOBAL=${GLOBAL:-4}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
prep_corpus gpt2
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), $MODEL seq $SEQ, global batch $GLOBAL"
common=(--set model.seq_len="$SEQ" --set train.micro_batch=1 --set train.global_batch="$GLOBAL"
        --set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set checkpoint.resume=never
        --set checkpoint.every=0)

echo "| layout (dp, pp, tp) | ranks | tokens/s | vs tp=2 | tensor all-reduce share | sent MB/step/rank (tp) | Megatron's count | predicted MB/rank |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
tp2_tps=""
for lay in "1 1 2" "2 1 1" "1 2 1" "1 1 1"; do
  set -- $lay
  n=$(($1 * $2 * $3))
  dir="$OUT/layout_$1_$2_$3"
  rm -rf "$dir"
  mpirun --oversubscribe -np "$n" "$BIN" train "$MODEL" "${common[@]}" --set parallel.dp="$1" \
    --set parallel.pp="$2" --set parallel.tp="$3" --set run.dir="$dir" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log"; exit 1; }
  read -r tps share sent pred < <(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "tokens_per_s" in r][1:]
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
share = sum(r.get("tp_reduce_fraction", 0.0) for r in steps) / len(steps)
sent = steps[-1].get("tp_sent_mb", 0.0)
pred = [r["memory_predicted"] for r in recs if "memory_predicted" in r][0][0]["total"]
print(f"{tps:.1f} {share:.3f} {sent:.2f} {pred / 1e6:.0f}")
PY
)
  [ -n "$tp2_tps" ] || tp2_tps=$tps
  # Megatron's count, from the model's shape: micro-batches M = GLOBAL / dp.
  want=$(python3 - "$MODEL" "$SEQ" "$GLOBAL" "$1" "$3" <<'PY'
import re, sys
deck = open(sys.argv[1]).read()
L, C = (int(re.search(rf"^{k}\s*=\s*(\d+)", deck, re.M).group(1)) for k in ("n_layer", "n_embd"))
T, G, dp, tp = (int(x) for x in sys.argv[2:])
M, B = G // dp, 1
elements = (4 * L + 2) * B * T * C + 3 * B * T
print(f"{M * 2 * 4 * elements * (tp - 1) / tp / 1e6:.2f}")
PY
)
  printf "| (%d, %d, %d) | %d | %s | %.2f | %.1f%% | %s | %s | %s |\n" "$1" "$2" "$3" "$n" "$tps" \
    "$(awk -v a="$tps" -v b="$tp2_tps" 'BEGIN{print a/b}')" \
    "$(awk -v s="$share" 'BEGIN{print 100*s}')" "$sent" "$want" "$pred"
done
