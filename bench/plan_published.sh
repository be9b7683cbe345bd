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
#  - NVIDIA NeMo Framework 24.12 performance summary: GPT3-175B on 128
#    H100 (TP 4, PP 8, virtual pipeline 6, GBS 256, MBS 1, seq 2048), FP8:
#    716 tokens/s/GPU, 771 model TFLOP/s/GPU (counted without
#    recomputation). mpiformer has no FP8: its prediction is bf16.
# For each: the published layout priced as given (micro-batch 1; the
# published runs' recomputation: full for Megatron's, attention (as NeMo's
# selective) and the distributed optimizer (zero 1) for NeMo's; NeMo's
# interleaved schedule with its 6 chunks a stage and its sequence
# parallelism (Megatron's 2021 runs predate it); 1F1B for Megatron's,
# whose chunk counts Table 1 does not give), and the plan's own best
# layout on the same GPUs (interleaving with 2 and 4 chunks searched). TFLOP/s are counted as the
# published figure counts them ("recompute": with the extra forward;
# "model": without).
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
echo "| model | GPUs | machine | published: layout (t, p, dp), batch | published TFLOP/s/GPU (count) | predicted for that layout | difference | plan's best layout | its tokens/s/GPU | vs published tokens/s | its GiB/GPU |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
# name layers hidden heads batch GPUs t p published_tflops count zero recompute machine chunks sp
while read -r name l h a batch n t p pub count zero rc machine v sp; do
  deck "$name" "$l" "$h" "$a" "$batch"
  dp=$((n / (t * p)))
  m="inputs/machines/$machine.toml"
  tag="$name.$machine"
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --as-given --json --set parallel.tp="$t" \
    --set parallel.pp="$p" --set parallel.dp="$dp" --set parallel.zero="$zero" \
    --set train.recompute="$rc" --set parallel.virtual_stages="$v" \
    --set parallel.sequence_parallel="$sp" \
    --set parallel.schedule="$([ "$v" -gt 1 ] && echo interleaved || echo 1f1b)" \
    >"$OUT/$tag.given.json" 2>"$OUT/$tag.given.err" </dev/null || true
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --ranks "$n" --top 1 --json \
    >"$OUT/$tag.best.json" 2>"$OUT/$tag.best.err" </dev/null || true
  /usr/bin/python3 - "$OUT/$tag.given.json" "$OUT/$tag.best.json" "$name" "$n" "$machine" \
    "$t $p $dp" "$batch" "$pub" "$l" "$h" "$count" <<'PY'
import json, sys
given, best, name, n, machine, lay, batch, pub, l, h, count = sys.argv[1:]
n, B, l, h = int(n), int(batch), int(l), int(h)
s, V = 2048, 51200
# Megatron's count per step, with the recomputation's extra forward (what
# the published TFLOP/s count), and the model's own (MFU's, without it).
F_recompute = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
F_model = 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V
F = F_recompute if count == "recompute" else F_model
def load(path):
    try:
        rows = json.load(open(path))["layouts"]
        return rows[0] if rows else None
    except Exception:
        return None
g, b = load(given), load(best)
b = b if b and b["fits"] else None
published = float(pub) if pub != "-" else None
if g and g["fits"]:
    g_tf = F / (g["step_s"] * n) / 1e12
    gtxt = f"{g_tf:.0f}"
    dtxt = f"{100 * (g_tf / published - 1):+.0f}%" if published else ""
elif g:
    gtxt, dtxt = f"does not fit ({g['memory_max'] / 2**30:.0f} GiB)", ""
else:
    gtxt, dtxt = "?", ""
if b:
    btxt = f"t {b['tp']} p {b['pp']} dp {b['dp']} mb {b['micro_batch']} zero {b['zero']} {b['recompute']} {b['schedule']}" + (f" v{b['virtual_stages']}" if b.get('virtual_stages', 1) > 1 else "") + (" sp" if b.get('sequence_parallel') else "")
    tps = B * s / b["step_s"] / n
    # The published run's tokens/s per GPU, from its TFLOP/s.
    vs = f"{100 * (tps / (published * 1e12 * B * s / F) - 1):+.0f}%" if published else ""
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} ({count}) | {gtxt} | {dtxt} | {btxt} | {tps:.0f} | {vs} | {b['memory_max'] / 2**30:.1f} |")
else:
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} ({count}) | {gtxt} | {dtxt} | nothing fits | | | |")
PY
done <<'ROWS'
gpt-1.7b 24 2304 24 512 32 1 1 137 recompute 0 full dgx-a100-80gb 1 false
gpt-3.6b 30 3072 32 512 64 2 1 138 recompute 0 full dgx-a100-80gb 1 false
gpt-7.5b 36 4096 32 512 128 4 1 142 recompute 0 full dgx-a100-80gb 1 false
gpt-18.4b 40 6144 48 1024 256 8 1 135 recompute 0 full dgx-a100-80gb 1 false
gpt-39.1b 48 8192 64 1536 512 8 2 138 recompute 0 full dgx-a100-80gb 1 false
gpt-76.1b 60 10240 80 1792 1024 8 4 140 recompute 0 full dgx-a100-80gb 1 false
gpt-145.6b 80 12288 96 2304 1536 8 8 148 recompute 0 full dgx-a100-80gb 1 false
gpt3-175b 96 12288 96 1536 1024 8 8 - recompute 0 full dgx-a100-80gb 1 false
gpt3-175b 96 12288 96 256 128 4 8 771 model 1 attention dgx-h100 6 true
gpt-1.3b 24 2048 16 512 8 1 1 - model 0 none dgx-h100 1 false
ROWS
