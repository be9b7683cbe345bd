#!/usr/bin/env bash
# Long context on paper: Llama-3-8B's shape at 32k and 128k tokens on
# dgx-h100.toml (8 H100s a node), which layouts fit with and without
# context parallelism, and the planner's speed for them, for
# bench/RESULTS.md. bf16, zero 3, full recomputation (what a long context
# needs first), micro_batch 1, tensor parallelism with sequence
# parallelism inside a node, cp the rest of the tensor group's node or
# beyond, dp the ranks left; global batch GB sequences.
# No run: the accounting the trainer refuses decks with (DESIGN 11), and
# the planner's pricing. The GPU's ring has not run on a GPU yet (its
# bf16 blocks are the fused kernel's tile scheme, priced at the fused
# kernel's rates, unmeasured): these figures say what the planner expects
# of it, not what was measured.
#   GB=16 PRESET=cpu
source "$(dirname "$0")/lib.sh"
GB=${GB:-16}
MACHINE=inputs/machines/dgx-h100.toml
llama3_8b=(--set model.n_layer=32 --set model.n_embd=4096 --set model.n_head=32
  --set model.n_kv_head=8 --set model.ffn_hidden=14336 --set model.vocab_size=128256
  --set model.rope_theta=500000.0)
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F), Llama-3-8B shape, $MACHINE, global batch $GB"
echo "| seq_len | ranks | tp | cp | dp | GiB/rank (planned max) | fits | tokens/s | MFU | step: compute / ring exposed / bubble+dp s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for seq in 32768 131072; do
  for ranks in 8 16 32; do
    for tp in 8 4 2; do
      for cp in 1 2 4 8 16; do
        [ $((ranks % (tp * cp))) -eq 0 ] || continue
        dp=$((ranks / (tp * cp)))
        [ $((GB % dp)) -eq 0 ] || continue
        # Keep the table to the tp the node holds and cp beyond it.
        json=$("$BIN" plan inputs/llama-160m.toml "${llama3_8b[@]}" --set model.seq_len=$seq \
          --set train.precision=bf16 --set train.micro_batch=1 --set train.global_batch="$GB" \
          --set train.recompute=full --set parallel.dp=$dp --set parallel.tp=$tp \
          --set parallel.cp=$cp --set parallel.sequence_parallel=true --set parallel.zero=3 \
          --machine "$MACHINE" --ranks "$ranks" --as-given --json 2>/dev/null || true)
        [ -n "$json" ] || { echo "| $seq | $ranks | $tp | $cp | $dp | (refused) | | | | |"; continue; }
        python3 - "$seq" "$ranks" "$tp" "$cp" "$dp" "$json" <<'PY'
import json, sys
seq, ranks, tp, cp, dp, text = sys.argv[1:7]
l = json.loads(text)["layouts"][0]
rest = l["step_s"] - l["compute_s"]
fits = "yes" if l["fits"] else "no"
print(f"| {seq} | {ranks} | {tp} | {cp} | {dp} | {l['memory_max'] / 2**30:.1f} / "
      f"{l['memory_planned'] / 2**30:.1f} | {fits} | {l['tokens_per_s']:.0f} | {100 * l['mfu']:.1f}% | "
      f"{l['compute_s']:.2f} / {l['cp_comm_s']:.3f} / {rest:.2f} |")
PY
      done
    done
  done
done
