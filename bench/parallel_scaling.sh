#!/usr/bin/env bash
# Pipeline bubble and data-parallel scaling, measured by the trainer itself
# (the bubble and tokens/s of metrics.jsonl), one BLAS thread per rank.
#  - bubble: pp = 2 and 4, several micro-batch counts m, both schedules,
#    against the theoretical (pp - 1) / (m + pp - 1);
#  - DP efficiency: tokens/s per rank at dp = 2 over dp = 1.
# On a machine with fewer cores than ranks the ranks share cores, and the
# measured waits include waiting for a core: read those rows with care.
#   PRESET=cpu  OUT=bench-out  STEPS=5
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}
STEPS=${STEPS:-5}
mkdir -p "$OUT"
prep_corpus byte
# A model whose micro-batch compute (tens of ms) dwarfs the activation
# messages (0.5 MB), so the bubble is the schedule's, not the network's.
model=(--set model.n_layer=8 --set model.n_embd=256 --set model.n_head=8 --set model.seq_len=128
       --set train.micro_batch=4 --set train.steps="$STEPS" --set train.log_every=1
       --set train.eval_every=0 --set data.val='""' --set run.peak_tflops=1)

# Mean of a metrics field over the steps after the first (warm-up).
mean() { python3 -c "import json,sys; v=[j[sys.argv[2]] for j in map(json.loads, open(sys.argv[1])) if sys.argv[2] in j][1:]; print(sum(v)/len(v))" "$@"; }

echo "| pp | m | schedule | measured bubble | theory (pp-1)/(m+pp-1) | tokens/s |"
echo "| --- | --- | --- | --- | --- | --- |"
for pp in 2 4; do
  for m in $pp $((2 * pp)) $((4 * pp)); do
    for sched in 1f1b gpipe; do
      dir="$OUT/bubble_pp${pp}_m${m}_$sched"
      mpirun --oversubscribe -np "$pp" "$BIN" train inputs/tiny.toml "${model[@]}" \
        --set parallel.pp=$pp --set parallel.schedule=$sched --set train.global_batch=$((4 * m)) \
        --set run.dir="$dir" >"$dir.log" 2>&1
      printf "| %d | %d | %s | %.1f%% | %.1f%% | %.0f |\n" "$pp" "$m" "$sched" \
        "$(mean "$dir/metrics.jsonl" bubble | awk '{print 100*$1}')" \
        "$(mean "$dir/metrics.jsonl" bubble_theory | awk '{print 100*$1}')" \
        "$(mean "$dir/metrics.jsonl" tokens_per_s)"
    done
  done
done
echo
echo "| dp | global batch | tokens/s | tokens/s per rank | efficiency vs dp=1 | reduce exposed ms |"
echo "| --- | --- | --- | --- | --- | --- |"
base=""
for dp in 1 2; do
  dir="$OUT/dp$dp"
  mpirun --oversubscribe -np "$dp" "$BIN" train inputs/tiny.toml "${model[@]}" \
    --set parallel.dp=$dp --set train.global_batch=$((8 * dp)) --set run.dir="$dir" >"$dir.log" 2>&1
  tps=$(mean "$dir/metrics.jsonl" tokens_per_s)
  per=$(awk -v t="$tps" -v d="$dp" 'BEGIN{print t/d}')
  [ -n "$base" ] || base=$per
  exposed=0
  [ "$dp" -gt 1 ] && exposed=$(mean "$dir/metrics.jsonl" reduce_exposed_ms)
  printf "| %d | %d | %.0f | %.0f | %.1f%% | %.1f |\n" "$dp" $((8 * dp)) "$tps" "$per" \
    "$(awk -v p="$per" -v b="$base" 'BEGIN{print 100*p/b}')" "$exposed"
done
