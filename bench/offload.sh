#!/usr/bin/env bash
# [train] offload = "nvme" against "none" on this machine (host back end,
# one BLAS thread per rank), measured by the trainer itself: for each zero
# stage in ZEROS, the predicted bytes per rank (memory_predicted's total of
# stage 0), the measured growth of the fullest rank's peak resident memory
# over its start (memory_measured: the OS's getrusage maxrss), tokens/s and
# the optimizer step's time (optimizer_ms; means of the steps after the
# first), and nvme's ratio to none. The disk under OFFLOAD_DIR is measured
# first with dd (direct I/O, 2 GiB each way): the bound the streamed
# update can reach. LARGEST=1 instead: the largest model of a GPT-2 shape
# the trainer accepts at zero 3 with full recomputation, with and without
# nvme. PRECISION=bf16: mixed precision, where the float masters leave
# with the moments. CHECKPOINT=1 instead: nvme at zero 0 saving a
# checkpoint after step 1, then resuming from it for step 2: each run's
# peak resident growth against the prediction (a save reads the state
# through views of its files and a resume writes it through them, a
# tensor's pages at a time).
#   MODEL=inputs/gpt2-350m.toml SEQ=256 DP=2 ACC=8 STEPS=3 ZEROS="0 3" PRECISION=fp32
#   OFFLOAD_DIR=/tmp/mpiformer-offload OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/offload
MODEL=${MODEL:-inputs/gpt2-350m.toml}
SEQ=${SEQ:-256}
DP=${DP:-2}
ACC=${ACC:-8}
STEPS=${STEPS:-3}
ZEROS=${ZEROS:-0 3}
PRECISION=${PRECISION:-fp32}
OFFLOAD_DIR=${OFFLOAD_DIR:-/tmp/mpiformer-offload}
mkdir -p "$OUT" "$OFFLOAD_DIR"
prep_corpus gpt2
common=(--set model.seq_len="$SEQ" --set train.micro_batch=1
        --set train.global_batch=$((ACC * DP)) --set train.steps="$STEPS" --set train.log_every=1
        --set train.eval_every=0 --set data.val='""' --set run.peak_tflops=1
        --set parallel.dp="$DP" --set checkpoint.resume=never --set checkpoint.at_end=false
        --set train.offload_dir="$OFFLOAD_DIR" --set train.precision="\"$PRECISION\"")

# The disk: 2 GiB written and read back with direct I/O.
probe=$OFFLOAD_DIR/dd-probe
write=$(dd if=/dev/zero of="$probe" bs=16M count=128 oflag=direct 2>&1 | tail -1 | sed 's/.*, //')
read=$(dd if="$probe" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/.*, //')
rm -f "$probe"
echo "disk under $OFFLOAD_DIR (dd, direct I/O, 16 MiB blocks): write $write, read $read"


if [ -n "${CHECKPOINT:-}" ]; then
  dir=$OUT/checkpoint
  rm -rf "$dir"
  echo "$MODEL, $PRECISION, seq $SEQ, dp $DP, zero 0, nvme: peak growth (MB) of each rank against the prediction"
  for steps in 1 2; do
    at_end=$([ "$steps" = 1 ] && echo true || echo false)
    mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" --set parallel.zero=0 \
      --set train.offload='"nvme"' --set train.steps="$steps" --set checkpoint.resume=auto \
      --set checkpoint.at_end="$at_end" --set checkpoint.dir="$dir/ckpt" --set run.dir="$dir" \
      >"$dir.$steps.log" 2>&1 || { tail -5 "$dir.$steps.log"; echo "$dir failed"; exit 1; }
    what=$([ "$steps" = 1 ] && echo "step 1 and the save" || echo "the resume and step 2")
    echo "$what: $(grep -E '^  rank [0-9]+ \(stage' "$dir.$steps.log" | tr -s ' ' | tr '\n' ';')"
  done
  exit 0
fi

if [ -n "${LARGEST:-}" ]; then
  # The largest n_layer of a GPT-2 shape with 2048 channels (16 heads, seq
  # 128) the trainer accepts at dp DP, zero 3 and full recomputation, with
  # and without nvme: it refuses a deck that does not fit before
  # allocating, so a run still going after 12 s was accepted.
  big=(--set model.n_embd=2048 --set model.n_head=16 --set model.seq_len=128
       --set parallel.zero=3 --set train.recompute='"full"' --set train.steps=1)
  accepted() {  # offload n_layer
    local log=$OUT/largest.log rc=0
    timeout 12 mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" "${big[@]}" \
      --set model.n_layer="$2" --set train.offload="$1" --set run.dir="$OUT/largest" >"$log" 2>&1 || rc=$?
    pkill -f "$BIN train $MODEL" 2>/dev/null || true
    sleep 1
    ! grep -q "mpiformer: error" "$log" && [ "$rc" -eq 124 ]
  }
  for where in none nvme; do
    lo=1 hi=128  # accepted(lo); hi refused or untried
    while [ $((hi - lo)) -gt 1 ]; do
      mid=$(((lo + hi) / 2))
      if accepted "$where" "$mid"; then lo=$mid; else hi=$mid; fi
    done
    python3 -c "L=$lo; C=2048; print('offload $where: n_layer %d, %.2f G parameters' % (L, (12*L*C*C+13*L*C+50257*C+128*C+2*C)/1e9))"
  done
  exit 0
fi

echo "$MODEL, $PRECISION, seq $SEQ, dp $DP, $ACC micro-batches of 1 per step, $STEPS steps"
echo "zero | offload | predicted MB | measured MB | tokens/s | optimizer ms | measured / none | step time / none"
for zero in $ZEROS; do
  base=""
  for where in none nvme; do
    dir=$OUT/z${zero}_$where
    rm -rf "$dir"
    mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" \
      --set parallel.zero="$zero" --set train.offload="$where" --set run.dir="$dir" >"$dir.log" 2>&1 ||
      { tail -5 "$dir.log"; echo "$dir failed"; exit 1; }
    read -r pred meas tps opt <<<"$(run_summary "$dir" optimizer_ms)"
    if [ -z "$base" ]; then
      base="$meas $tps"
      echo "$zero | $where | $pred | $meas | $tps | $opt | 1 | 1"
    else
      read -r bm bt <<<"$base"
      python3 -c "print('$zero | $where | $pred | $meas | $tps | $opt | %.2f | %.2f' % ($meas / $bm, $bt / $tps))"
    fi
  done
done
