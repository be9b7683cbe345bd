#!/usr/bin/python3
"""An independent reader of a Hugging Face Llama directory (what `mpiformer
export --format hf` writes for a Llama-family checkpoint) and Llama's
forward pass in numpy (float64) on it. It shares no code with mpiformer:
safetensors is read from its description (gpt2_numpy.py's reader), shards
through
model.safetensors.index.json, and the model is written from
LlamaForCausalLM's definition: RMSNorm, q/k/v projections, rotary
positions with rotate_half (pairs i, i + head_dim/2), grouped-query
attention (repeat_kv), SwiGLU (silu(gate) * up, then down), the final
norm and lm_head (or the tied embedding). A Mixtral directory
(MixtralForCausalLM, what a Mixture of Experts exports as) has in place of
each MLP block_sparse_moe: its gate (the router) gives each token's
softmax over the experts, the top num_experts_per_tok of them (ties to the
lower index) weighed by their probabilities renormalised over those, each
expert SwiGLU with w1 (gate), w3 (up) and w2 (down); no capacity.

usage:
  llama_numpy.py hf DIR                      config, names and shapes (and the index)
  llama_numpy.py logits DIR IDS LOGITS.bin   this forward against mpiformer's
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_numpy import check_logits, read_safetensors  # noqa: E402  (shared)


def load(d):
    cfg = json.load(open(f"{d}/config.json"))
    index = f"{d}/model.safetensors.index.json"
    w, files = {}, []
    if os.path.exists(index):
        weight_map = json.load(open(index))["weight_map"]
        files = sorted(set(weight_map.values()))
        for f in files:
            _, part = read_safetensors(f"{d}/{f}")
            for k in part:
                assert weight_map[k] == f, f"{k} is in {f}, the index says {weight_map[k]}"
            w.update(part)
        assert set(w) == set(weight_map), set(w) ^ set(weight_map)
    else:
        _, w = read_safetensors(f"{d}/model.safetensors")
    return cfg, w, files


def expected_shapes(cfg):
    C, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    F, NH, NKV = cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = C // NH
    s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = [V, C]
    E = cfg.get("num_local_experts", 0)
    for i in range(L):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                  p + "self_attn.q_proj.weight": [NH * hd, C],
                  p + "self_attn.k_proj.weight": [NKV * hd, C],
                  p + "self_attn.v_proj.weight": [NKV * hd, C],
                  p + "self_attn.o_proj.weight": [C, NH * hd]})
        if E == 0:
            s.update({p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                      p + "mlp.down_proj.weight": [C, F]})
            continue
        m = p + "block_sparse_moe."
        s[m + "gate.weight"] = [E, C]
        for e in range(E):
            s.update({f"{m}experts.{e}.w1.weight": [F, C], f"{m}experts.{e}.w3.weight": [F, C],
                      f"{m}experts.{e}.w2.weight": [C, F]})
    return s


def swiglu(h, gate, up, down):
    g, u = h @ gate.T, h @ up.T
    return (g / (1 + np.exp(-g)) * u) @ down.T


def sparse_moe(cfg, p, h):
    """Mixtral's block_sparse_moe on rows h [T, C]."""
    E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    logits = h @ p("block_sparse_moe.gate.weight").T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :K]  # ties: the lower index first
    gates = np.take_along_axis(prob, top, -1)
    gates /= gates.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(K):
            e = f"block_sparse_moe.experts.{top[t, j]}."
            out[t] += gates[t, j] * swiglu(h[t], p(e + "w1.weight"), p(e + "w3.weight"),
                                           p(e + "w2.weight"))
    return out


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def forward(cfg, w, ids):
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T, hd = len(ids), C // NH
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(T), inv)
    cos = np.cos(np.concatenate([ang, ang], -1))
    sin = np.sin(np.concatenate([ang, ang], -1))
    rope = lambda x: x * cos + rotate_half(x) * sin
    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"model.layers.{i}.{n}"]
        h = rmsnorm(x, p("input_layernorm.weight"), eps)
        q = (h @ p("self_attn.q_proj.weight").T).reshape(T, NH, hd).transpose(1, 0, 2)
        k = (h @ p("self_attn.k_proj.weight").T).reshape(T, NKV, hd).transpose(1, 0, 2)
        v = (h @ p("self_attn.v_proj.weight").T).reshape(T, NKV, hd).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, NH // NKV, 0), np.repeat(v, NH // NKV, 0)  # repeat_kv
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        y = (s / s.sum(-1, keepdims=True)) @ v
        x = x + y.transpose(1, 0, 2).reshape(T, C) @ p("self_attn.o_proj.weight").T
        h = rmsnorm(x, p("post_attention_layernorm.weight"), eps)
        if cfg.get("num_local_experts", 0):
            x = x + sparse_moe(cfg, p, h)
        else:
            x = x + swiglu(h, p("mlp.gate_proj.weight"), p("mlp.up_proj.weight"),
                           p("mlp.down_proj.weight"))
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def main():
    mode = sys.argv[1]
    if mode == "hf":
        cfg, w, files = load(sys.argv[2])
        arch = "MixtralForCausalLM" if cfg.get("num_local_experts") else "LlamaForCausalLM"
        assert cfg["model_type"] == arch[:-len("ForCausalLM")].lower(), cfg
        assert cfg["architectures"] == [arch], cfg
        assert cfg["hidden_act"] == "silu", cfg
        want = expected_shapes(cfg)
        got = {k: list(v.shape) for k, v in w.items()}
        assert got == want, (set(got) ^ set(want), [k for k in want if got.get(k) != want[k]][:3])
        print(f"hf: {len(w)} tensors with {arch}'s names and shapes in "
              f"{max(len(files), 1)} file(s), config {cfg['num_hidden_layers']} x "
              f"{cfg['hidden_size']}, {cfg['num_key_value_heads']} kv heads")
    elif mode == "logits":
        cfg, w, _ = load(sys.argv[2])
        check_logits(lambda ids: forward(cfg, w, ids), cfg["vocab_size"], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
