#!/usr/bin/env bash
# The planner on Llama-2-7B's and Llama-3-8B's shapes (and the latter with 2
# kv heads), for bench/RESULTS.md:
# memory per rank (GiB) and whether it fits, on one node of each shipped
# machine file, at tp 1/2/4/8 (dp the rest of the node) with zero 1 and
# 3, bf16, micro_batch 1, no recomputation, global batch 64 sequences.
# No run: the accounting the trainer refuses decks with (DESIGN 11).
#   PRESET=cpu
source "$(dirname "$0")/lib.sh"
llama2_7b=(--set model.n_layer=32 --set model.n_embd=4096 --set model.n_head=32
  --set model.n_kv_head=32 --set model.ffn_hidden=11008 --set model.vocab_size=32000
  --set model.seq_len=4096)
llama3_8b=(--set model.n_layer=32 --set model.n_embd=4096 --set model.n_head=32
  --set model.n_kv_head=8 --set model.ffn_hidden=14336 --set model.vocab_size=128256
  --set model.seq_len=8192 --set model.rope_theta=500000.0)
# The same with 2 kv heads: at tp 4 and 8 each is held whole by 2 and 4
# tensor ranks, which sum its gradients.
llama3_8b_kv2=("${llama3_8b[@]}" --set model.n_kv_head=2)
for machine in inputs/machines/*.toml; do
  node=$(sed -n 's/^devices_per_node *= *\([0-9]*\).*/\1/p' "$machine")
  echo "== $(basename "$machine" .toml): $node devices per node"
  printf "%-12s %5s %4s %4s %10s %6s %10s\n" model zero tp dp "GiB/rank" fits "tokens/s"
  for model in llama2_7b llama3_8b llama3_8b_kv2; do
    declare -n shape=$model
    for zero in 1 3; do
      for tp in 1 2 4 8; do
        [ "$tp" -le "$node" ] || continue
        dp=$((node / tp))
        # A layout that does not fit exits 2 after its JSON (fits: false).
        json=$("$BIN" plan inputs/llama-160m.toml "${shape[@]}" --set train.precision=bf16 \
          --set train.micro_batch=1 --set train.global_batch=64 --set parallel.dp=$dp \
          --set parallel.tp=$tp --set parallel.zero=$zero --machine "$machine" --ranks "$node" \
          --as-given --json 2>/dev/null || true)
        python3 -c '
import json, sys
l = json.load(sys.stdin)["layouts"][0]
m, tp, dp, z = sys.argv[1:5]
gib, fits, tps = l["memory_max"] / 2**30, str(l["fits"]), l["tokens_per_s"]
print(f"{m:<12} {z:>5} {tp:>4} {dp:>4} {gib:>10.2f} {fits:>6} {tps:>10.0f}")' \
          "$model" "$tp" "$dp" "$zero" <<<"$json"
      done
    done
  done
done
