#!/usr/bin/env python3
"""Roofline of one training step of the CUDA back end, kernel by kernel.

For each kernel the stage launches (kernels/cuda, as they are written:
the bytes each reads and writes, and the FLOPs of each product), the time
it cannot beat on a GPU of the given peak and memory bandwidth:
max(FLOPs / peak, bytes / bandwidth). Summed over a step, against the
model FLOPs MFU counts (6N + 12LTC per token), this says what MFU the
kernels allow at best, and which kernels hold it back, so the device's
figures (bench/gpu-check.sh) can be judged against it.

Two practical ceilings are shown beside the roofline: GEMMs at GEMM_EFF of
the peak (cuBLASLt's large bf16 GEMMs reach ~70% on Hopper) and streaming
kernels at MEM_EFF of the bandwidth (~80%). Attention is priced as the
fused kernels of kernels/cuda/attention.cu (the default): the causal half
of the products on tensor cores (mma.sync m16n8k16) at --fused-eff of the
peak (0.5 is what FlashAttention-2 reports for its scheme on Hopper, which
the kernel follows: register accumulators, cp.async double buffering),
the backward's 5 products in one kernel, and memory O(B*T*C) (q and dO
are re-read per key tile from L2, and dQ's float sum goes through L2 in
turn: neither is counted against HBM). `--attention batched` prices the
design it replaced: batched GEMMs around softmax kernels over the stored
T x T scores.

  python3 bench/roofline.py [--model gpt2-350m] [--micro-batch 16] [--seq 1024]
                            [--peak-tflops 989] [--bandwidth-gbs 4800]
                            [--attention fused|batched] [--fused-eff 0.5] [--markdown]

Defaults: gpt2-350m at seq_len 1024, micro-batch 16, bf16, on an H200
(989 TFLOP/s dense bf16, the H100 SXM's tensor cores; 4.8 TB/s HBM3e).
"""
import argparse

MODELS = {  # n_layer, n_head, n_embd
    "gpt2-124m": (12, 12, 768),
    "gpt2-350m": (24, 16, 1024),
    "gpt2-774m": (36, 20, 1280),
}
VOCAB_PADDED = 50304
GEMM_EFF, MEM_EFF = 0.70, 0.80


def kernels(L, NH, C, T, B, a, fused):
    """(name, count per step, FLOPs, bytes, is_gemm) of one step (one micro-batch)."""
    N, hs, V, acc = B * T, C // NH, VOCAB_PADDED, 4
    S = B * NH * T * T  # elements of a T x T matrix per (batch, head)
    k = []

    def gemm(name, m, n, kk, out_bytes=a, beta=False, count=L):
        flops = 2 * m * n * kk
        byts = (m * kk + kk * n) * a + m * n * out_bytes * (2 if beta else 1)
        k.append((name, count, flops, byts, True))

    def stream(name, elements_rw, count=L, flops=0):
        k.append((name, count, flops, elements_rw, False))

    # ---- forward, per layer
    stream("layernorm fwd (x2)", 2 * (2 * N * C * a + 2 * N * acc), L)
    gemm("qkv matmul fwd", N, 3 * C, C)
    if fused:
        # q, k, v read once per query block pass (K/V re-read from L2 per
        # block: counted once), out and lse written.
        k.append(("fused attention fwd", L, 2 * 2 * S * hs // 2, 3 * N * C * a + N * C * a + B * NH * T * acc, "fused"))
    else:
        stream("split heads (permute)", 2 * 3 * N * C * a)
        gemm("scores QK^T (batched)", B * NH * T, T, hs, count=L)
        stream("causal softmax fwd", 2 * S * a)
        gemm("values AV (batched)", B * NH * T, hs, T, count=L)
        stream("merge heads (permute)", 2 * N * C * a)
    gemm("attn proj fwd", N, C, C)
    stream("residual fwd (x2)", 2 * 3 * N * C * a)
    gemm("fc fwd", N, 4 * C, C)
    stream("gelu fwd", 2 * 4 * N * C * a)
    gemm("fc proj fwd", N, C, 4 * C)
    # ---- backward, per layer (dW accumulates in fp32: beta = 1)
    for name, cin, cout in (("fc proj", 4 * C, C), ("fc", C, 4 * C), ("attn proj", C, C), ("qkv", C, 3 * C)):
        gemm(f"{name} dinp", N, cin, cout)
        gemm(f"{name} dW", cout, cin, N, out_bytes=acc, beta=True)
        stream(f"{name} bias grad (column sums)", N * cout * a)
    stream("gelu bwd", 3 * 4 * N * C * a)
    stream("layernorm bwd (x2)", 2 * (3 * N * C * a + 2 * N * acc))
    stream("residual grad adds (x2)", 2 * 3 * N * C * a)
    if fused:
        # D = rowsum(dO * O); then one kernel of 5 products (S, dP, dV,
        # dK, dQ): q, k, v, dO, lse and D read, dq, dk, dv written.
        stream("fused attention bwd: D = rowsum(dO O)", 2 * N * C * a + B * NH * T * acc)
        k.append(("fused attention bwd (5 products)", L, 5 * 2 * S * hs // 2,
                  4 * N * C * a + 2 * B * NH * T * acc + 3 * N * C * a, "fused"))
    else:
        stream("split heads + permute dY (bwd)", 2 * 4 * N * C * a)
        gemm("dA = dY V^T (batched)", B * NH * T, T, hs)
        gemm("dV = A^T dY (batched)", B * NH * T, hs, T)
        stream("causal softmax bwd", 3 * S * a)
        gemm("dQ = dS K (batched)", B * NH * T, hs, T)
        gemm("dK = dS^T Q (batched)", B * NH * T, hs, T)
        stream("merge dq dk dv (permute)", 2 * 3 * N * C * a)
    # ---- outside the blocks, once per micro-batch
    stream("embedding fwd + bwd", 3 * N * C * a + 2 * N * C * acc, 1)
    stream("final layernorm fwd + bwd", 5 * N * C * a, 1)
    gemm("lm head fwd", N, V, C, count=1)
    # One read for the log-sum-exp (the online softmax's pair), one read
    # and one write for the gradient.
    stream("cross-entropy (fused fwd + bwd)", 3 * N * V * a, 1)
    gemm("lm head dinp", N, C, V, count=1)
    gemm("lm head dW", V, C, N, out_bytes=acc, beta=True, count=1)
    return k


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-350m", choices=sorted(MODELS))
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--bandwidth-gbs", type=float, default=4800.0)
    p.add_argument("--fp32", action="store_true", help="fp32 activations (default bf16)")
    p.add_argument("--attention", choices=("fused", "batched"), default="fused",
                   help="fused kernels (as written now) or batched GEMMs over stored scores")
    p.add_argument("--fused-eff", type=float, default=0.5,
                   help="fraction of the peak the fused attention's products reach")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    L, NH, C = MODELS[args.model]
    T, B, a = args.seq, args.micro_batch, 4 if args.fp32 else 2
    peak, bw = args.peak_tflops * 1e12, args.bandwidth_gbs * 1e9
    fused = args.attention == "fused"
    rows = kernels(L, NH, C, T, B, a, fused)
    # AdamW once per step over every parameter: p, g, m, v read, p, m, v
    # written in fp32, the bf16 copy written: 30 bytes a parameter.
    n_params = L * (12 * C * C + 13 * C) + VOCAB_PADDED * C + T * C + 2 * C
    rows.append(("AdamW (per step)", 1, 0, n_params * (28 + (a if a == 2 else 0)), False))
    total_roof = total_prac = 0.0
    table = []
    for name, count, flops, byts, kind in rows:
        t_flop, t_mem = flops / peak, byts / bw
        roof = count * max(t_flop, t_mem)
        eff = GEMM_EFF if kind is True else args.fused_eff if kind == "fused" else None
        prac = count * max(t_flop / eff if eff else 0.0, t_mem / MEM_EFF)
        total_roof += roof
        total_prac += prac
        bound = "compute" if t_flop >= t_mem else "memory"
        table.append((name, count, flops * count / 1e9, byts * count / 1e6, bound, roof * 1e3, prac * 1e3))
    tokens = B * T
    model_flops = (6 * n_params + 12 * L * T * C) * tokens
    if args.markdown:
        print(f"| kernel | launches | GFLOP | MB moved | bound | roofline ms | practical ms |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in table:
            print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]} | {r[5]:.3f} | {r[6]:.3f} |")
    else:
        print(f"{'kernel':44s} {'n':>3s} {'GFLOP':>9s} {'MB':>9s} {'bound':>8s} {'roof ms':>8s} {'prac ms':>8s}")
        for r in table:
            print(f"{r[0]:44s} {r[1]:3d} {r[2]:9.1f} {r[3]:9.1f} {r[4]:>8s} {r[5]:8.3f} {r[6]:8.3f}")
    print(f"\n{args.model}, seq {T}, micro-batch {B}, {'fp32' if a == 4 else 'bf16'}, "
          f"attention {'fused' if fused else 'batched (T x T stored)'}; "
          f"{args.peak_tflops:.0f} TFLOP/s, {args.bandwidth_gbs:.0f} GB/s")
    print(f"step (one micro-batch): roofline {total_roof * 1e3:.2f} ms -> MFU <= "
          f"{100 * model_flops / peak / total_roof:.1f}%; practical ({GEMM_EFF:.0%} GEMM, {MEM_EFF:.0%} "
          f"bandwidth{', %d%% fused attention' % (100 * args.fused_eff) if fused else ''}) "
          f"{total_prac * 1e3:.2f} ms -> MFU {100 * model_flops / peak / total_prac:.1f}%, "
          f"{tokens / total_prac:.0f} tokens/s")


if __name__ == "__main__":
    main()
