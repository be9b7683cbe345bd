#!/usr/bin/env bash
# [model] init: a fresh run from pretrained weights, read under any layout.
#  - Round trips bit for bit: checkpoint -> hf -> init -> export hf again,
#    under (1,1,1) and under (2,1,2) with zero 3; checkpoint -> llmc ->
#    init under (1,2,2) zero 1 -> export llmc again; checkpoint -> init from
#    the checkpoint itself (weights only) under (2,2,1) -> export. Each
#    init run takes one step at lr 0, so its checkpoint holds the weights it
#    read (AdamW moves nothing at lr 0, weight decay included), then the
#    exports are compared with cmp.
#  - The model's shape comes from the file where the deck omits it and is
#    checked where the deck gives it; a .safetensors without config.json
#    needs n_head from the deck.
#  - Every kind of bad file is refused, naming the file and the tensor or
#    field: exit 2.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
run_mpi 1 train "$DECK" --set train.steps=4 --set train.global_batch=16 --set train.micro_batch=8 \
  --set run.dir=src >src.log 2>&1 || { cat src.log; fail "training the source model"; }
ckpt=src/checkpoints/step_00000004.h5
"$MPIFORMER" export "$ckpt" --format hf --output hf >/dev/null || fail "export hf"
"$MPIFORMER" export "$ckpt" --format llmc --output model.bin >/dev/null || fail "export llmc"

# One step at lr 0 from `init` under a layout: run directory DIR.
still() {  # dir init dp pp tp zero [deck]
  local dir=$1 init=$2 dp=$3 pp=$4 tp=$5 zero=$6 deck=${7:-$DECK}
  run_mpi $((dp * pp * tp)) train "$deck" --set model.init="$init" --set train.steps=1 \
    --set train.lr=0 --set train.min_lr=0 --set train.global_batch=16 --set train.micro_batch=4 \
    --set parallel.dp="$dp" --set parallel.pp="$pp" --set parallel.tp="$tp" --set parallel.zero="$zero" \
    --set data.val='""' --set run.dir="$dir" >"$dir.log" 2>&1 || { cat "$dir.log"; fail "$dir failed"; }
  grep -q "^init: weights from" "$dir.log" || fail "$dir: no init line"
}
still a hf 1 1 1 0
"$MPIFORMER" export a/checkpoints/step_00000001.h5 --format hf --output a_hf >/dev/null
cmp hf/model.safetensors a_hf/model.safetensors || fail "hf -> init -> hf is not bit for bit"
still b hf 2 1 2 3
"$MPIFORMER" export b/checkpoints/step_00000001.h5 --format hf --output b_hf >/dev/null
cmp hf/model.safetensors b_hf/model.safetensors || fail "hf -> init (2,1,2) zero 3 -> hf is not bit for bit"
still c model.bin 1 2 2 1
"$MPIFORMER" export c/checkpoints/step_00000001.h5 --format llmc --output c.bin >/dev/null
cmp model.bin c.bin || fail "llmc -> init (1,2,2) zero 1 -> llmc is not bit for bit"
still d "$ckpt" 2 2 1 0
"$MPIFORMER" export d/checkpoints/step_00000001.h5 --format hf --output d_hf >/dev/null
cmp hf/model.safetensors d_hf/model.safetensors || fail "checkpoint -> init (2,2,1) is not bit for bit"
grep -q "mpiformer checkpoint (weights only)" d.log || fail "the checkpoint init is not named"
echo "ok: round trips bit for bit (hf, llmc, checkpoint; several layouts and zero stages)"

# The shape from the file.
cat >bare.toml <<EOF
[model]
init = "hf"
[data]
train = "data/tinyshakespeare_byte.h5"
[train]
steps = 1
global_batch = 16
micro_batch = 16
lr = 1e-4
EOF
run_mpi 1 train bare.toml --set run.dir=bare >bare.log 2>&1 || { cat bare.log; fail "a deck without the model's shape"; }
grep -q "model: .* 4 layers, 4 heads, 128 channels, vocab 256" bare.log || { cat bare.log; fail "the file's shape was not taken"; }
expect_refusal() {  # want args...
  local want=$1
  shift
  local rc=0
  run_mpi 1 train "$@" --set run.dir=refused >refused.log 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$want" refused.log || { cat refused.log; fail "'$want' not reported (exit $rc)"; }
  echo "ok: $want"
}
expect_refusal "[model] n_embd: 64, but [model] init's hf/model.safetensors holds 128" "$DECK" \
  --set model.init=hf --set model.n_embd=64
expect_refusal "[model] vocab_size: 300, but [model] init's" "$DECK" --set model.init=hf --set model.vocab_size=300
mkdir bare_st && cp hf/model.safetensors bare_st/
expect_refusal "[model] n_head: missing, and bare_st/model.safetensors does not say" bare.toml \
  --set model.init=bare_st/model.safetensors
run_mpi 1 train bare.toml --set model.init=bare_st/model.safetensors --set model.n_head=4 --set run.dir=st \
  >st.log 2>&1 || { cat st.log; fail "a bare .safetensors with n_head from the deck"; }

# Bad files. A safetensors file rewritten by this test (json + struct).
rewrite() {  # out python-statements-on-header-h-and-tensors-t
  python3 - hf/model.safetensors "$1" "$2" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
h = json.loads(data[8:8 + n])
body = data[8 + n:]
t = {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
exec(sys.argv[3])
at, out = 0, b""
for k in [k for k in h if k != "__metadata__"]:
    h[k]["data_offsets"] = [at, at + len(t[k])]
    out += t[k]
    at += len(t[k])
head = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(head)) + head + out)
PY
}
mkdir -p bad
rewrite bad/missing.safetensors 'del h["transformer.h.1.mlp.c_fc.bias"]; del t["transformer.h.1.mlp.c_fc.bias"]'
rewrite bad/shape.safetensors 'k = "transformer.h.2.attn.c_proj.weight"; h[k]["shape"] = [128, 64]; t[k] = t[k][:128 * 64 * 4]'
rewrite bad/dtype.safetensors 'h["transformer.ln_f.bias"]["dtype"] = "I32"'
head -c 100000 hf/model.safetensors >bad/truncated.safetensors
python3 -c "
import struct; d = bytearray(open('hf/model.safetensors', 'rb').read()); d[0:8] = struct.pack('<Q', 1 << 40)
open('bad/length.safetensors', 'wb').write(d)"
expect_refusal "bad/missing.safetensors: transformer.h.1.mlp.c_fc.bias: missing" "$DECK" --set model.init=bad/missing.safetensors
expect_refusal "bad/shape.safetensors: transformer.h.2.attn.c_proj.weight: shape [128, 64], the model needs [128, 128]" \
  "$DECK" --set model.init=bad/shape.safetensors
expect_refusal "bad/dtype.safetensors: transformer.ln_f.bias: dtype I32: mpiformer reads F32, BF16 and F16" "$DECK" --set model.init=bad/dtype.safetensors
expect_refusal "do not hold a F32 [384] tensor within the file's 94960 bytes of data (a header that lies, or a truncated file)" \
  "$DECK" --set model.init=bad/truncated.safetensors
expect_refusal "bad/length.safetensors: header length: 1099511627776 bytes" "$DECK" --set model.init=bad/length.safetensors
head -c 5000 model.bin >bad/short.bin
expect_refusal "bad/short.bin: size: 5000 bytes, the header's model needs" "$DECK" --set model.init=bad/short.bin
python3 -c "
import struct; d = bytearray(open('model.bin', 'rb').read()); struct.pack_into('<i', d, 4, 7)
open('bad/version.bin', 'wb').write(d)"
expect_refusal "bad/version.bin: header version: 7" "$DECK" --set model.init=bad/version.bin
# A model whose vocabulary is smaller than the data's.
printf 'text in GPT-2 tokens\n' >g.txt
"$MPIFORMER" prep --tokenizer gpt2 --output g.h5 g.txt >/dev/null 2>&1 || fail "prep gpt2"
expect_refusal "the data's vocabulary (50257) exceeds [model] vocab_size (256)" "$DECK" --set model.init=hf \
  --set data.train=g.h5 --set data.val='""'
echo "not weights" >bad/text.txt
expect_refusal "bad/text.txt: [model] init: not a weights file mpiformer reads" "$DECK" --set model.init=bad/text.txt
expect_refusal "nothing/here: [model] init: does not exist" "$DECK" --set model.init=nothing/here
echo "ok: every bad file refused, named"
