#!/usr/bin/env bash
# `mpiformer plan` for clusters this machine cannot be, against published
# figures of other trainers on the same hardware. The machine files are
# inputs/machines/ (datasheet rates, not calibrated); the models are the
# published ones (GPT-3 style: vocab 51200, seq 2048, bf16):
#  - Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
#    Clusters Using Megatron-LM" (SC21, arXiv:2104.04473), Table 1: Megatron
#    on Selene (DGX A100 80GB, 8 HDR HCAs per node), interleaved 1F1B,
#    activation recomputation, TFLOP/s per GPU counted with recomputation
#    (F = 96 B s l h^2 (1 + s / 6h + V / 16 l h) per step).
#  - the GPT-3 175B shape (96 layers, 12288 wide, 96 heads) on DGX H100.
# For each: the published layout priced as given (1F1B without
# interleaving: mpiformer has no interleaved schedule; micro-batch 1; full
# recomputation), and the plan's own best layout on the same GPUs.
#   OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/plan_published
mkdir -p "$OUT"
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)"

deck() {  # name layers hidden heads global
  cat >"$OUT/$1.toml" <<TOML
# $1: GPT-3 style, as in the published comparison (bench/plan_published.sh)
[model]
n_layer = $2
n_embd = $3
n_head = $4
seq_len = 2048
vocab_size = 51200
[data]
train = "data/your_tokens.bin"   # not read by plan: the vocabulary is given
[train]
steps = 1000
global_batch = $5
micro_batch = 1
lr = 1e-4
precision = "bf16"
recompute = "full"
TOML
}

echo
echo "| model | GPUs | machine | published layout (t, p, dp), batch | published TFLOP/s/GPU | predicted, that layout | predicted layout: best of the plan | its TFLOP/s/GPU | its memory GiB/GPU |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
# name layers hidden heads batch GPUs t p published_tflops machine
while read -r name l h a batch n t p pub machine; do
  deck "$name" "$l" "$h" "$a" "$batch"
  dp=$((n / (t * p)))
  m="inputs/machines/$machine.toml"
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --as-given --json --set parallel.tp="$t" \
    --set parallel.pp="$p" --set parallel.dp="$dp" >"$OUT/$name.given.json" </dev/null || true
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --ranks "$n" --top 1 --json \
    >"$OUT/$name.best.json" </dev/null || true
  /usr/bin/python3 - "$OUT/$name.given.json" "$OUT/$name.best.json" "$name" "$n" "$machine" \
    "$t $p $dp" "$batch" "$pub" "$l" "$h" <<'PY'
import json, sys
given, best, name, n, machine, lay, batch, pub, l, h = sys.argv[1:]
n, B, l, h = int(n), int(batch), int(l), int(h)
s, V = 2048, 51200
# Megatron's count (with the recomputation's extra forward), per step.
F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
def load(path):
    try:
        rows = json.load(open(path))["layouts"]
        return rows[0] if rows else None
    except Exception:
        return None
def tflops(r):
    return F / (r["step_s"] * n) / 1e12
g, b = load(given), load(best)
gtxt = f"{tflops(g):.0f} ({100 * (tflops(g) / float(pub) - 1):+.0f}%)" if g and g["step_s"] > 0 else "does not fit"
if b:
    btxt = f"t {b['tp']} p {b['pp']} dp {b['dp']} mb {b['micro_batch']} zero {b['zero']} {b['recompute']} {b['schedule']}"
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} | {gtxt} | {btxt} | {tflops(b):.0f} | {b['memory_max'] / 2**30:.1f} |")
else:
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} | {gtxt} | nothing fits | | |")
PY
done <<'ROWS'
gpt-1.7b 24 2304 24 512 32 1 1 137 dgx-a100-80gb
gpt-3.6b 30 3072 32 512 64 2 1 138 dgx-a100-80gb
gpt-7.5b 36 4096 32 512 128 4 1 142 dgx-a100-80gb
gpt-18.4b 40 6144 48 1024 256 8 1 135 dgx-a100-80gb
gpt-39.1b 48 8192 64 1536 512 8 2 138 dgx-a100-80gb
gpt-76.1b 60 10240 80 1792 1024 8 4 140 dgx-a100-80gb
gpt-145.6b 80 12288 96 2304 1536 8 8 148 dgx-a100-80gb
gpt3-175b 96 12288 96 1536 1024 8 8 - dgx-a100-80gb
gpt3-175b-h100 96 12288 96 1536 1024 8 8 - dgx-h100
ROWS
