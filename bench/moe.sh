#!/usr/bin/env bash
# A Mixture of Experts against the dense model of the same active
# parameters on this machine: inputs/llama-moe-tiny.toml (8 SwiGLU experts
# of width 176, top 2) and inputs/llama-tiny.toml (one SwiGLU of 352), one
# run each of the same STEPS steps and batch on one rank: tokens/s (mean of
# the steps after the first), the validation loss at the end (the same
# tokens seen), the parameters held and active, and the MoE run's routing
# at the end (aux loss, the least and most loaded expert, drops).
#   PRESET=cpu STEPS=200 PRECISION=fp32
source "$(dirname "$0")/lib.sh"
STEPS=${STEPS:-200}
PRECISION=${PRECISION:-fp32}
prep_corpus byte
echo "== $(date -u +%F) $(nproc) cores, $(git rev-parse --short HEAD), $STEPS steps of 32 x 64 tokens, one rank, $PRECISION"
printf "%-15s %10s %10s %10s %9s %s\n" deck parameters active "tokens/s" "val loss" routing
for deck in llama-tiny llama-moe-tiny; do
  dir=$(mktemp -d)
  mpirun -np 1 "$BIN" train "inputs/$deck.toml" --set train.steps="$STEPS" \
    --set train.eval_every=0 --set train.precision="$PRECISION" --set checkpoint.at_end=false \
    --set run.dir="$dir" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  params=$(sed -n "s/^model: \([0-9]*\) parameters.*/\1/p" "$dir.log" | head -1)
  active=$(sed -n "s/.*; \([0-9]*\) parameters active per token$/\1/p" "$dir.log" | head -1)
  read -r _ _ tps _ < <(run_summary "$dir" loss)
  val=$(sed -n "s/^final val loss \([0-9.]*\).*/\1/p" "$dir.log")
  routing=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"aux_loss"' in l]
if rows:
    r = rows[-1]
    print(f"aux {r['aux_loss']:.3f}, load {r['expert_load_min']:.2f}-{r['expert_load_max']:.2f}, "
          f"dropped {100 * r['dropped_fraction']:.1f}% (step {r['step']})")
PY
)
  printf "%-15s %10s %10s %10s %9s %s\n" "$deck" "$params" "${active:-$params}" "$tps" "$val" "$routing"
  rm -rf "$dir" "$dir.log"
done
