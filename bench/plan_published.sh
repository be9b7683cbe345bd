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
#  - Llama Team, AI @ Meta, "The Llama 3 Herd of Models" (arXiv:2407.21783),
#    Table 4: Llama 3 405B (126 layers, 16384 wide, 128 heads, 8 kv heads,
#    SwiGLU 53248, vocabulary 128256) pre-trained in BF16 on H100s (700 W,
#    80 GB HBM3; 400 Gb/s per GPU between nodes) at sequence length 8192,
#    16M tokens a step (2048 sequences), TP 8, PP 16: 430 TFLOP/s per GPU on
#    8,192 GPUs (DP 64) and 400 on 16,384 (DP 128), BF16 MFU 43% and 41%.
#    The paper's FSDP shards the optimizer state and the gradients and keeps
#    the weights after the forward; it accumulates the gradients in FP32
#    over a step's micro-batches and reduce-scatters them in FP32 (its
#    section 3.3.2, "Numerical stability"), and trains at 8K tokens without
#    activation checkpointing. PyTorch's pipeline stages
#    (torch.distributed.pipelining) run FSDP that way: gradient sync off
#    for every backward of a step but its last, so whole gradients add up
#    over the micro-batches and are reduce-scattered once. That is zero 1
#    here (whole fp32 gradients, sharded fp32 state, bf16 weights kept
#    whole), the table's rows; whether Meta's own stack did the same is not
#    stated (the second table). Its pipeline schedule interleaves several
#    chunks a stage, with one layer fewer on the first and on the
#    last stage, as mpiformer cuts 126 layers into 16 x v chunks. The paper
#    gives no chunk count: the table's rows take 4 (8 would leave the first
#    and last chunks empty), and a second table prices 2 and 4 chunks with
#    the gradients reduced every micro-batch (zero 2) or once a step
#    (zero 1). Its long-context row (CP 16, 131072 tokens) is
#    left out: how it counts causal attention's FLOPs decides that row's
#    figure and is not stated. TFLOP/s of these rows are mpiformer's count
#    (6 x the multiplied parameters + 12 x layers x seq x width a token:
#    "mpiformer"), which puts the 8,192-GPU figure at 43.5% of the 989
#    TFLOP/s peak, as the paper's MFU.
#   OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
OUT=${OUT:-bench-out}/plan_published
mkdir -p "$OUT"
echo "mpiformer $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)"

deck() {  # name layers hidden heads global seq vocab kv_heads ffn (kv_heads 0: GPT-3 style)
  local family=""
  [ "$8" -gt 0 ] && family="family = \"llama\"
n_kv_head = $8
ffn_hidden = $9
rope_theta = 500000.0"
  cat >"$OUT/$1.toml" <<TOML
# $1: as in the published comparison (bench/plan_published.sh)
[model]
$family
n_layer = $2
n_embd = $3
n_head = $4
seq_len = $6
vocab_size = $7
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
#   seq vocab kv_heads ffn (deck's)
while read -r name l h a batch n t p pub count zero rc machine v sp seq vocab kv ffn; do
  deck "$name" "$l" "$h" "$a" "$batch" "$seq" "$vocab" "$kv" "$ffn"
  dp=$((n / (t * p)))
  m="inputs/machines/$machine.toml"
  tag="$name.$machine.$n"
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --as-given --json --set parallel.tp="$t" \
    --set parallel.pp="$p" --set parallel.dp="$dp" --set parallel.zero="$zero" \
    --set train.recompute="$rc" --set parallel.virtual_stages="$v" \
    --set parallel.sequence_parallel="$sp" \
    --set parallel.schedule="$([ "$v" -gt 1 ] && echo interleaved || echo 1f1b)" \
    >"$OUT/$tag.given.json" 2>"$OUT/$tag.given.err" </dev/null || true
  "$BIN" plan "$OUT/$name.toml" --machine "$m" --ranks "$n" --top 1 --json \
    >"$OUT/$tag.best.json" 2>"$OUT/$tag.best.err" </dev/null || true
  /usr/bin/python3 - "$OUT/$tag.given.json" "$OUT/$tag.best.json" "$name" "$n" "$m" \
    "$t $p $dp" "$batch" "$pub" "$l" "$h" "$count" "$seq" "$vocab" <<'PY'
import json, re, sys
given, best, name, n, mfile, lay, batch, pub, l, h, count, s, V = sys.argv[1:]
n, B, l, h, s, V = int(n), int(batch), int(l), int(h), int(s), int(V)
machine = mfile.split("/")[-1][:-5]
peak = float(re.search(r"^peak_tflops\s*=\s*([0-9.eE+]+)", open(mfile).read(), re.M).group(1))
def load(path):
    try:
        rows = json.load(open(path))["layouts"]
        return rows[0] if rows else None
    except Exception:
        return None
g, b = load(given), load(best)
b = b if b and b["fits"] else None
# FLOPs a step as the published figure counts them: Megatron's, with the
# recomputation's extra forward ("recompute") or without it ("model"); or
# mpiformer's own (MFU's), read back from any priced layout of the deck.
if count == "recompute":
    F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
elif count == "model":
    F = 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V
else:
    r = g or b
    F = r["mfu"] * peak * 1e12 * r["step_s"] * n if r else None
published = float(pub) if pub != "-" else None
if g and F:
    g_tf = F / (g["step_s"] * n) / 1e12
    gtxt = f"{g_tf:.0f}"
    if not g["fits"]:
        gtxt += f" (needs {g['memory_max'] / 2**30:.0f} GiB: does not fit)"
    dtxt = f"{100 * (g_tf / published - 1):+.0f}%" if published else ""
else:
    gtxt, dtxt = "?", ""
if b:
    btxt = f"t {b['tp']} p {b['pp']} dp {b['dp']} mb {b['micro_batch']} zero {b['zero']} {b['recompute']} {b['schedule']}" + (f" v{b['virtual_stages']}" if b.get('virtual_stages', 1) > 1 else "") + (" sp" if b.get('sequence_parallel') else "") + (f" cp {b['cp']}" if b.get('cp', 1) > 1 else "")
    tps = B * s / b["step_s"] / n
    # The published run's tokens/s per GPU, from its TFLOP/s.
    vs = f"{100 * (tps / (published * 1e12 * B * s / F) - 1):+.0f}%" if published else ""
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} ({count}) | {gtxt} | {dtxt} | {btxt} | {tps:.0f} | {vs} | {b['memory_max'] / 2**30:.1f} |")
else:
    print(f"| {name} | {n} | {machine} | {lay}, {B} | {pub} ({count}) | {gtxt} | {dtxt} | nothing fits | | | |")
PY
done <<'ROWS'
gpt-1.7b 24 2304 24 512 32 1 1 137 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-3.6b 30 3072 32 512 64 2 1 138 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-7.5b 36 4096 32 512 128 4 1 142 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-18.4b 40 6144 48 1024 256 8 1 135 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-39.1b 48 8192 64 1536 512 8 2 138 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-76.1b 60 10240 80 1792 1024 8 4 140 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt-145.6b 80 12288 96 2304 1536 8 8 148 recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt3-175b 96 12288 96 1536 1024 8 8 - recompute 0 full dgx-a100-80gb 1 false 2048 51200 0 0
gpt3-175b 96 12288 96 256 128 4 8 771 model 1 attention dgx-h100 6 true 2048 51200 0 0
gpt-1.3b 24 2048 16 512 8 1 1 - model 0 none dgx-h100 1 false 2048 51200 0 0
llama3-405b 126 16384 128 2048 8192 8 16 430 mpiformer 1 none dgx-h100 4 true 8192 128256 8 53248
llama3-405b 126 16384 128 2048 16384 8 16 400 mpiformer 1 none dgx-h100 4 true 8192 128256 8 53248
ROWS

# Llama 3 405B's interleaved schedule at 2 and 4 chunks a stage (126
# layers: the first and the last chunk one layer short; 8 chunks would
# leave them none), and 1F1B. The paper gives neither its chunk count nor,
# for certain, when its gradients are reduced (the header: zero 1 is the
# reading the table's rows take): zero 2 reduces each chunk's gradients
# every micro-batch, zero 1 once a step. Published tokens/s per GPU from
# its TFLOP/s and mpiformer's count of the model's FLOPs.
echo
echo "| Llama 3 405B | GPUs | zero | schedule | step s = compute + exposed + bubble + optimizer | GiB/GPU | tokens/s/GPU | vs published |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for n in 8192 16384; do
  for zero in 2 1; do
    for v in 1 2 4; do
      tag="llama3-405b.dgx-h100.$n.z$zero.v$v"
      "$BIN" plan "$OUT/llama3-405b.toml" --machine inputs/machines/dgx-h100.toml --as-given \
        --json --set parallel.tp=8 --set parallel.pp=16 --set parallel.dp=$((n / 128)) \
        --set parallel.zero="$zero" --set train.recompute=none \
        --set parallel.schedule="$([ "$v" -gt 1 ] && echo interleaved || echo 1f1b)" \
        --set parallel.virtual_stages="$v" --set parallel.sequence_parallel=true \
        >"$OUT/$tag.json" 2>"$OUT/$tag.err" </dev/null || true
      /usr/bin/python3 - "$OUT/$tag.json" "$n" "$zero" "$v" "$([ "$n" = 8192 ] && echo 430 || echo 400)" <<'PY'
import json, sys
path, n, zero, v, pub = sys.argv[1:]
n, pub = int(n), float(pub)
try:
    g = json.load(open(path))["layouts"][0]
except Exception:
    print(f"| | {n} | {zero} | v {v} | ? | | | |")
    sys.exit()
B, s = 2048, 8192
# mpiformer's FLOPs a token (MFU x peak x step x GPUs / tokens), against
# the published TFLOP/s.
f_tok = g["mfu"] * 989e12 * g["step_s"] * n / (B * s)
tps = B * s / g["step_s"] / n
sched = f"interleaved v{v}" if int(v) > 1 else "1f1b"
print(f"| | {n} | {zero} | {sched} | {g['step_s']:.2f} = {g['compute_s']:.2f} + {g['exposed_comm_s']:.2f} + "
      f"{g['bubble_s']:.2f} + {g['optimizer_s']:.2f} | {g['memory_max'] / 2**30:.0f} | {tps:.0f} | "
      f"{100 * (tps / (pub * 1e12 / f_tok) - 1):+.0f}% |")
PY
    done
  done
done
