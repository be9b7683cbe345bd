#!/usr/bin/env bash
# The planner on Mixtral-8x7B's shape (32 layers of 8 SwiGLU experts, top
# 2, 4096 channels, 8 kv heads, seq 4096), bf16, global batch 256
# sequences, on 64 ranks of DGX H100 (inputs/machines/dgx-h100.toml), for
# bench/RESULTS.md:
#  1. dp 8 x pp 4 x tp 2, micro-batch 1, at ZeRO 1 and 3, each capacity
#     factor of CAPACITIES (0: dropless), at ep 1, 2, 4 and 8: GiB on the
#     fullest rank, whether it fits, tokens/s, the all-to-alls' seconds;
#  2. the search [parallel] auto runs: its five fastest layouts.
# No run: the accounting and the prediction the trainer plans with.
#   CAPACITIES="1.25 0" PRESET=cpu
source "$(dirname "$0")/lib.sh"
machine=inputs/machines/dgx-h100.toml
mixtral=(--set model.n_layer=32 --set model.n_embd=4096 --set model.n_head=32
  --set model.n_kv_head=8 --set model.ffn_hidden=14336 --set model.vocab_size=32000
  --set model.seq_len=4096 --set model.rope_theta=1000000.0 --set model.experts=8
  --set model.top_k=2 --set train.precision=bf16 --set train.micro_batch=1
  --set train.global_batch=256)
echo "== $(date -u +%F) $(git rev-parse --short HEAD): Mixtral-8x7B's shape on 64 ranks of $(basename "$machine" .toml)"
printf "%9s %5s %3s %10s %6s %10s %8s\n" capacity zero ep "GiB/rank" fits "tokens/s" "ep s"
for cf in ${CAPACITIES:-1.25 0}; do
  for zero in 1 3; do
    for ep in 1 2 4 8; do
      # A layout that does not fit exits 2 after its JSON (fits: false).
      json=$("$BIN" plan inputs/llama-160m.toml "${mixtral[@]}" --set model.capacity_factor="$cf" \
        --set parallel.dp=8 --set parallel.pp=4 --set parallel.tp=2 --set parallel.zero="$zero" \
        --set parallel.ep="$ep" --machine "$machine" --ranks 64 --as-given --json 2>/dev/null || true)
      python3 -c '
import json, sys
l = json.load(sys.stdin)["layouts"][0]
print("{:>9} {:>5} {:>3} {:>10.2f} {:>6} {:>10.0f} {:>8.3f}".format(
    sys.argv[1], sys.argv[2], l["ep"], l["memory_max"] / 2**30, str(l["fits"]),
    l["tokens_per_s"], l["ep_comm_s"]))' "$cf" "$zero" <<<"$json"
    done
  done
done
echo "== the search (capacity factor 1.25): the five fastest of every layout"
"$BIN" plan inputs/llama-160m.toml "${mixtral[@]}" --set model.capacity_factor=1.25 \
  --machine "$machine" --ranks 64 --top 5 2>/dev/null | grep -v "^plan: [0-9]"
