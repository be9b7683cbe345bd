#!/usr/bin/env bash
# llama-160m against gpt2-124m on this machine, one run each of the same
# batch (micro_batch 4, seq_len SEQ, dp 2 on the machine's cores): tokens/s
# and the fullest rank's memory, measured (peak growth of resident memory)
# and predicted (the accounting), for bench/RESULTS.md. Both read the
# sample corpus's byte tokens (ids below either vocabulary): the models
# run at their own vocabularies (50257, 32000), which the timing includes.
#   PRESET=cpu SEQ=256 STEPS=4 PRECISION=fp32
source "$(dirname "$0")/lib.sh"
SEQ=${SEQ:-256}
STEPS=${STEPS:-4}
PRECISION=${PRECISION:-fp32}
prep_corpus byte
echo "== $(date -u +%F) $(nproc) cores, $(git rev-parse --short HEAD), seq_len $SEQ, micro_batch 4, dp 2, $PRECISION"
printf "%-11s %10s %12s %12s %12s\n" model parameters "tokens/s" "measured MB" "predicted MB"
for deck in gpt2-124m llama-160m; do
  dir=$(mktemp -d)
  mpirun -np 2 "$BIN" train "inputs/$deck.toml" --set data.train=data/tinyshakespeare_byte.h5 \
    --set data.val=data/tinyshakespeare_byte_val.h5 --set model.seq_len="$SEQ" \
    --set train.micro_batch=4 --set train.global_batch=8 --set train.steps="$STEPS" \
    --set train.log_every=1 --set train.eval_every=0 --set parallel.dp=2 \
    --set train.precision="$PRECISION" --set run.dir="$dir" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; exit 1; }
  params=$(sed -n "s/^model: \([0-9]*\) parameters.*/\1/p" "$dir.log" | head -1)
  read -r pred meas tps _ < <(run_summary "$dir" loss)
  printf "%-11s %10s %12s %12s %12s\n" "$deck" "$params" "$tps" "$meas" "$pred"
  rm -rf "$dir" "$dir.log"
done
