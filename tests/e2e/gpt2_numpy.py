#!/usr/bin/python3
"""An independent reader of the weight files `mpiformer export` writes, and
GPT-2's forward pass in numpy (float64) on them. It shares no code with
mpiformer: the formats are read from their descriptions (safetensors: an
8-byte little-endian header length, a JSON header, raw data; llm.c: 256
int32 of header, the parameters in llm.c's order) and the model is written
from GPT-2's definition (Hugging Face's Conv1D layout: y = x W + b).

usage:
  gpt2_numpy.py hf DIR                     names, shapes and config.json
  gpt2_numpy.py logits DIR IDS LOGITS.bin  this forward against mpiformer's
  gpt2_numpy.py bf16 DIR_F32 DIR_BF16      bf16 = fp32 rounded to nearest even
  gpt2_numpy.py llmc FILE.bin DIR [bf16]   llm.c's file holds the same tensors
"""
import json
import struct
import sys

import numpy as np


def bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), f"{path}: header of {n} bytes in a file of {len(data)}"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        assert 0 <= b <= end <= len(body), (name, b, end, len(body))
        raw = body[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "BF16":
            a = bf16_to_f32(raw)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        else:
            raise AssertionError(f"{name}: dtype {e['dtype']}")
        assert a.size == int(np.prod(e["shape"])), (name, a.size, e["shape"])
        out[name] = a.reshape(e["shape"]).astype(np.float64)
    return header, out


def expected_shapes(cfg):
    C, L, V, T = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
    s = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [T, C],
         "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    for i in range(L):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C],
                  h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                  h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                  h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                  h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
                  h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
    return s


def load_hf(d):
    cfg = json.load(open(f"{d}/config.json"))
    header, w = read_safetensors(f"{d}/model.safetensors")
    return cfg, header, w


def layernorm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * g + b


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(cfg, w, ids):
    C, NH = cfg["n_embd"], cfg["n_head"]
    T, hd = len(ids), C // NH
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["n_layer"]):
        p = lambda n: w[f"transformer.h.{i}.{n}"]
        h = layernorm(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (qkv[:, j * C:(j + 1) * C].reshape(T, NH, hd).transpose(1, 0, 2) for j in range(3))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        y = (s / s.sum(-1, keepdims=True)) @ v
        x = x + y.transpose(1, 0, 2).reshape(T, C) @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = layernorm(x, p("ln_2.weight"), p("ln_2.bias"))
        x = x + gelu_new(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") \
            + p("mlp.c_proj.bias")
    x = layernorm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    return x @ w["transformer.wte.weight"].T  # the tied head


def check_logits(forward_ids, vocab, ids_file, logits_file):
    """generate's logits (float32 rows, one per generated token) and tokens
    (ids_file: the prompt's and the generated ids) against this forward:
    the same greedy tokens, and the logits within 1e-4 of their scale
    (fp32 against float64 in another summation order: ~1e-6 to 1e-5 seen;
    a wrong layout, rotation or head is O(1))."""
    ids = [int(t) for t in open(ids_file).read().split()]
    rows = np.fromfile(logits_file, dtype="<f4").reshape(-1, vocab)
    prompt = len(ids) - rows.shape[0]
    logits = forward_ids(ids[:-1])[prompt - 1:]
    err = np.abs(logits - rows).max() / np.abs(logits).max()
    assert err < 1e-4, f"logits differ by {err:.2e} of their scale"
    assert (logits.argmax(-1) == np.array(ids[prompt:])).all(), "greedy tokens differ"
    print(f"logits: {rows.shape[0]} positions match mpiformer's to {err:.1e} of their scale")


def main():
    mode = sys.argv[1]
    if mode == "hf":
        cfg, header, w = load_hf(sys.argv[2])
        assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
        assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5, cfg
        want = expected_shapes(cfg)
        got = {k: list(v.shape) for k, v in w.items()}
        assert got == want, (set(got) ^ set(want), [k for k in want if got.get(k) != want[k]][:3])
        assert header["__metadata__"]["format"] == "pt"
        print(f"hf: {len(w)} tensors with GPT2LMHeadModel's names and shapes, config {cfg['n_layer']}"
              f" x {cfg['n_embd']}, vocab {cfg['vocab_size']}")
    elif mode == "logits":
        cfg, _, w = load_hf(sys.argv[2])
        check_logits(lambda ids: forward(cfg, w, ids), cfg["vocab_size"], sys.argv[3], sys.argv[4])
    elif mode == "bf16":
        _, h32, w32 = load_hf(sys.argv[2])
        _, h16, w16 = load_hf(sys.argv[3])
        for k, a in w32.items():
            # Round to nearest even by hand: add 0x7fff + the kept low bit.
            bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
            assert (r.view(np.float32) == w16[k]).all(), k
            assert h16[k]["dtype"] == "BF16", k
        print(f"bf16: {len(w32)} tensors are the fp32 ones rounded to nearest even")
    elif mode == "llmc":
        path, d = sys.argv[2], sys.argv[3]
        bf16 = len(sys.argv) > 4
        cfg, _, w = load_hf(d)
        data = open(path, "rb").read()
        h = np.frombuffer(data[:1024], dtype="<i4")
        C, L, V, T, NH = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"], cfg["n_head"]
        Vp = int(h[7])
        assert h[0] == 20240326 and h[1] == (5 if bf16 else 3), h[:2]
        assert list(h[2:7]) == [T, V, L, NH, C] and Vp % 128 == 0 and Vp >= V, h[:8]
        vals = bf16_to_f32(data[1024:]) if bf16 else np.frombuffer(data[1024:], dtype="<f4")
        at = 0

        def take(shape):
            nonlocal at
            n = int(np.prod(shape))
            assert at + n <= vals.size, f"file ends inside a tensor at {at}"
            a = vals[at:at + n].reshape(shape).astype(np.float64)
            at += n
            return a
        wte = take([Vp, C])
        assert (wte[:V] == w["transformer.wte.weight"]).all() and (wte[V:] == 0).all(), "wte"
        assert (take([T, C]) == w["transformer.wpe.weight"]).all(), "wpe"
        # llm.c's order: each kind across all layers; its matrices [out, in].
        kinds = [("ln_1.weight", 0), ("ln_1.bias", 0), ("attn.c_attn.weight", 1), ("attn.c_attn.bias", 0),
                 ("attn.c_proj.weight", 1), ("attn.c_proj.bias", 0), ("ln_2.weight", 0), ("ln_2.bias", 0),
                 ("mlp.c_fc.weight", 1), ("mlp.c_fc.bias", 0), ("mlp.c_proj.weight", 1), ("mlp.c_proj.bias", 0)]
        for name, transposed in kinds:
            for i in range(L):
                ref = w[f"transformer.h.{i}.{name}"]
                ref = ref.T if transposed else ref
                assert (take(list(ref.shape)) == ref).all(), f"h.{i}.{name}"
        assert (take([C]) == w["transformer.ln_f.weight"]).all() and (take([C]) == w["transformer.ln_f.bias"]).all()
        assert at == vals.size, f"{vals.size - at} values after the last tensor"
        print(f"llmc: header and {at} parameters in llm.c's order equal the hf export's")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
