#!/usr/bin/env bash
# Hugging Face files as strict as their reference formats ([model] init):
# a shard index with an empty weight_map (a crash before), naming a tensor
# no shard holds or the wrong shard; safetensors headers with overlapping
# or fractional data_offsets or a key twice; config.json values the deck
# would refuse (0, -0.0, tiny, huge, negative, fractional, NaN-free but
# absurd), JSON of the wrong type anywhere, and each message naming
# config.json's own field. Every case: exit 2, the file and the field
# named, nothing written. Both model.safetensors and an index: the single
# file is read, as transformers does, and the init line says so.
source "$(dirname "$0")/lib.sh"
need_numpy
prep_sample_data
DECK="$SOURCE_DIR/inputs/llama-tiny.toml"
common=(--set train.steps=2 --set train.log_every=1 --set train.eval_every=0
        --set train.global_batch=4 --set train.micro_batch=4 --set run.peak_tflops=1)
run_mpi 1 train "$DECK" "${common[@]}" --set run.dir=src >src.log 2>&1 || { cat src.log; fail "training"; }
ck=src/checkpoints/step_00000002.h5
"$MPIFORMER" export "$ck" --format hf --output hf >/dev/null || fail "export"
"$MPIFORMER" export "$ck" --format hf --max-shard-mb 0.5 --output hfs >/dev/null || fail "export shards"

refused() {  # label dir expected-text
  local label=$1 dir=$2 want=$3 rc=0
  run_mpi 1 train "$DECK" "${common[@]}" --set model.init="$dir" --set run.dir="r_$label" \
    >"r_$label.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "r_$label.log"; fail "$label: exit $rc, expected 2"; }
  grep -qF -- "$want" "r_$label.log" || { cat "r_$label.log"; fail "$label: the message does not say: $want"; }
  ! compgen -G "r_$label/checkpoints/step_*.h5" >/dev/null || fail "$label: wrote a checkpoint"
}

# Variants, written by python: DIR/config.json edits, and safetensors
# headers rewritten.
"$PY" - <<'PY'
import json, os, shutil, struct
def clone(src, dst):
    shutil.copytree(src, dst)
def edit_config(dst, **changes):
    clone("hf", dst)
    c = json.load(open(f"{dst}/config.json"))
    for k, v in changes.items():
        c[k] = v
    open(f"{dst}/config.json", "w").write(json.dumps(c))
def raw_config(dst, text):
    clone("hf", dst)
    open(f"{dst}/config.json", "w").write(text)
def header_of(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    return data[8:8 + n].decode(), data[8 + n:]
def write_with_header(path, header_text, body):
    h = header_text.encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + body)

# config.json values the deck would refuse, under config.json's names.
for name, key, v in [("eps0", "rms_norm_eps", 0.0), ("epsneg0", "rms_norm_eps", -0.0),
                     ("epstiny", "rms_norm_eps", 1e-300), ("epshuge", "rms_norm_eps", 1e300),
                     ("epsneg", "rms_norm_eps", -1e-5), ("theta0", "rope_theta", 0.0),
                     ("thetaneg", "rope_theta", -10000.0), ("thetahuge", "rope_theta", 1e300),
                     ("ffn0", "intermediate_size", 0), ("layers0", "num_hidden_layers", 0),
                     ("vocab0", "vocab_size", 0), ("pos0", "max_position_embeddings", 0),
                     ("hidden_frac", "hidden_size", 64.5), ("kv_frac", "num_key_value_heads", 1.5),
                     ("mlpbias", "mlp_bias", True), ("type_num", "model_type", 7),
                     ("type_obj", "model_type", {"a": 1}), ("eps_str", "rms_norm_eps", "tiny")]:
    edit_config(f"c_{name}", **{key: v})
raw_config("c_dupkey", open("hf/config.json").read().rstrip()[:-1] + ', "hidden_size": 64}')

# The shard index.
def index_variant(dst, fn):
    clone("hfs", dst)
    j = json.load(open(f"{dst}/model.safetensors.index.json"))
    fn(j, dst)
    open(f"{dst}/model.safetensors.index.json", "w").write(json.dumps(j))
index_variant("i_empty", lambda j, d: j.__setitem__("weight_map", {}))
def ghost(j, d):
    j["weight_map"]["model.layers.7.mlp.up_proj.weight"] = next(iter(j["weight_map"].values()))
index_variant("i_ghost", ghost)
def wrong(j, d):
    files = sorted(set(j["weight_map"].values()))
    name = next(k for k, v in j["weight_map"].items() if v == files[0])
    j["weight_map"][name] = files[1]
index_variant("i_wrong", wrong)

# Both a single file and an index: transformers reads the single file.
clone("hf", "both")
shutil.copy("hfs/model.safetensors.index.json", "both/")

# safetensors headers.
def header_variant(dst, fn):
    clone("hf", dst)
    text, body = header_of(f"{dst}/model.safetensors")
    write_with_header(f"{dst}/model.safetensors", fn(text), body)
def overlap(text):
    h = json.loads(text)
    names = [k for k in h if k != "__metadata__"]
    a, b = sorted(names, key=lambda k: h[k]["data_offsets"][0])[:2]
    # b starts 4 bytes inside a; its length kept.
    s, e = h[b]["data_offsets"]
    h[b]["data_offsets"] = [s - 4, e - 4]
    return json.dumps(h)
header_variant("h_overlap", overlap)
def fraction(text):
    h = json.loads(text)
    k = next(k for k in h if k != "__metadata__")
    h[k]["data_offsets"] = [h[k]["data_offsets"][0] + 0.5, h[k]["data_offsets"][1]]
    return json.dumps(h)
header_variant("h_fraction", fraction)
def twice(text):
    h = json.loads(text)
    k = next(k for k in h if k != "__metadata__")
    return text.rstrip()[:-1] + ", " + json.dumps(k) + ": " + json.dumps(h[k]) + "}"
header_variant("h_twice", twice)
PY

refused eps0 c_eps0 "c_eps0/config.json: rms_norm_eps: 0.0, outside"
refused epsneg0 c_epsneg0 "c_epsneg0/config.json: rms_norm_eps: -0.0, outside"
refused epstiny c_epstiny "c_epstiny/config.json: rms_norm_eps: 1e-300, outside"
refused epshuge c_epshuge "c_epshuge/config.json: rms_norm_eps: 1e+300, outside"
refused epsneg c_epsneg "c_epsneg/config.json: rms_norm_eps: -1e-05, outside"
refused theta0 c_theta0 "c_theta0/config.json: rope_theta: 0.0, outside"
refused thetaneg c_thetaneg "c_thetaneg/config.json: rope_theta: -1e+04, outside"
refused thetahuge c_thetahuge "c_thetahuge/config.json: rope_theta: 1e+300, outside"
refused ffn0 c_ffn0 "c_ffn0/config.json: intermediate_size: 0, outside"
refused layers0 c_layers0 "c_layers0/config.json: num_hidden_layers: 0, outside"
refused vocab0 c_vocab0 "c_vocab0/config.json: vocab_size: 0, outside"
refused pos0 c_pos0 "c_pos0/config.json: max_position_embeddings: 0, outside"
refused hidden_frac c_hidden_frac "c_hidden_frac/config.json: hidden_size: must be a whole number, not a number 64.5"
refused kv_frac c_kv_frac "c_kv_frac/config.json: num_key_value_heads: must be a whole number"
refused mlpbias c_mlpbias "c_mlpbias/config.json: mlp_bias: biases are not part"
refused type_num c_type_num "c_type_num/config.json: model_type: must be a string, not an integer"
refused type_obj c_type_obj "c_type_obj/config.json: model_type: must be a string, not an object"
refused eps_str c_eps_str "c_eps_str/config.json: rms_norm_eps: must be a number, not a string"
refused dupkey c_dupkey "c_dupkey/config.json: the key \"hidden_size\" appears twice"
echo "ok: config.json values and types refused as the deck's, naming config.json's field"

refused i_empty i_empty "i_empty/model.safetensors.index.json: weight_map: empty: it names no tensor"
refused i_ghost i_ghost "i_ghost/model.safetensors.index.json: weight_map.model.layers.7.mlp.up_proj.weight: names a tensor no shard holds"
refused i_wrong i_wrong "but the tensor is in"
echo "ok: a shard index naming nothing, a tensor no shard holds, or the wrong shard, refused"

refused h_overlap h_overlap "h_overlap/model.safetensors"
grep -q "overlaps .*'s bytes" r_h_overlap.log || { cat r_h_overlap.log; fail "overlap: no message"; }
refused h_fraction h_fraction ".data_offsets: must be a whole number"
refused h_twice h_twice "h_twice/model.safetensors: header: the key"
echo "ok: safetensors headers with overlapping or fractional offsets or a key twice, refused"

run_mpi 1 train "$DECK" "${common[@]}" --set model.init=both --set run.dir=r_both >r_both.log 2>&1 ||
  { cat r_both.log; fail "init from a directory with both"; }
grep -q "init: weights from both/model.safetensors (Hugging Face safetensors; model.safetensors read; model.safetensors.index.json beside it ignored" r_both.log ||
  { cat r_both.log; fail "the init line does not say which file was read"; }
echo "ok: a single file and an index: the single file, said"
