#!/usr/bin/env bash
# What a probe with hostile inputs and faults found (issue 25, part 3): each
# case ends with one clear message and a non-zero exit, and leaves every
# input as it was. Every run at a small batch (SMALL_BATCH, unquoted: its
# words are the arguments): no case depends on it.
source "$(dirname "$0")/lib.sh"
prep_sample_data
export DECK="$SOURCE_DIR/inputs/tiny.toml" WORK
# expect RC "message part" CMD...: exit RC (any non-zero when RC is "fail")
# within 120 s, with that text in its output (inspect reports on stdout).
expect() {
  local want_rc=$1 want=$2 rc=0
  shift 2
  if declare -F "$1" >/dev/null; then  # a function of this script, run by a child shell
    timeout 120 bash -c "$(declare -f "$1")"'; "$@"' _ "$@" >out.txt 2>err.txt </dev/null || rc=$?
  else
    timeout 120 "$@" >out.txt 2>err.txt </dev/null || rc=$?
  fi
  [ "$rc" -ne 124 ] || fail "hung (timeout) for: $*"
  if [ "$want_rc" = fail ]; then [ "$rc" -ne 0 ] || fail "exit 0 for: $*"
  else [ "$rc" -eq "$want_rc" ] || { cat err.txt >&2; fail "exit $rc, expected $want_rc, for: $*"; }; fi
  cat out.txt err.txt | has -F -- "$want" || { cat err.txt >&2; fail "no '$want' in the output for: $*"; }
  echo "ok: $want"
}
unchanged() {  # unchanged FILE SUM: the file's checksum is still SUM
  [ "$(sha256sum <"$1")" = "$2" ] || fail "$1 was modified"
}
run_mpi 1 train "$DECK" $SMALL_BATCH --set train.steps=2 --set train.eval_every=0 --set run.dir=small >small.log 2>&1 ||
  { cat small.log; fail "the small run failed"; }
CK=small/checkpoints/step_00000002.h5

# 4. No output replaces an input, whatever the spelling or link.
cp "$DECK" deck.toml
cp "$SOURCE_DIR/inputs/machines/dgx-a100-80gb.toml" machine.toml
ln deck.toml deck-link.toml
ck_sum=$(sha256sum <"$CK") deck_sum=$(sha256sum <deck.toml) machine_sum=$(sha256sum <machine.toml)
expect 2 "is also the checkpoint" "$MPIFORMER" generate "$CK" --tokens 4 --logits "small/checkpoints/../checkpoints/step_00000002.h5"
unchanged "$CK" "$ck_sum"
expect 2 "--explain: is also the deck" "$MPIFORMER" plan deck.toml --machine machine.toml --ranks 2 --explain deck-link.toml
expect 2 "--explain: is also the machine file" "$MPIFORMER" plan deck.toml --machine machine.toml --ranks 2 --explain machine.toml
unchanged deck.toml "$deck_sum"
unchanged machine.toml "$machine_sum"
expect 2 "is also a deck it reads" mpirun -np 2 "$MPIFORMER" calibrate deck.toml -o ./deck.toml
unchanged deck.toml "$deck_sum"
# A full disk is an error, and leaves neither a short file nor its .tmp.
mkdir -p full
if mount -t tmpfs -o size=64k tmpfs full 2>/dev/null; then
  trap 'umount "$WORK/full" 2>/dev/null; rm -rf "$WORK"' EXIT
  expect fail "cannot write full/logits.bin.tmp" "$MPIFORMER" generate "$CK" --prompt "To be" --tokens 200 --logits full/logits.bin
  [ -z "$(ls full)" ] || fail "a full disk left $(ls full)"
  echo "ok: generate --logits to a full disk fails and leaves nothing"
else
  echo "note: no tmpfs here (needs root): the full-disk case of --logits is not run"
fi

# 3. Non-finite pretrained weights are refused, naming the tensor, even
# where steps would skip non-finite updates; a checkpoint is never
# published with non-finite weights (a memory fault injected before a save).
"$MPIFORMER" export "$CK" --format hf --output nan_hf >/dev/null || fail "export hf"
python3 - nan_hf/model.safetensors <<'PY'
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
begin = header["transformer.h.1.attn.c_attn.weight"]["data_offsets"][0]
data[8 + n + begin + 4 * 7:8 + n + begin + 4 * 8] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(data)
PY
expect 2 "model.safetensors: tensor h.1.attn.c_attn.weight: holds NaN" \
  mpirun -np 2 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=2 --set 'model.init="nan_hf"' \
  --set 'train.nonfinite="skip"' --set parallel.dp=2 --set run.dir=nan_init --set run.peak_tflops=1
[ ! -e nan_init/checkpoints/latest ] || fail "a run from NaN weights published a checkpoint"
expect 2 "the weights of step 4 hold NaN or infinity: this checkpoint is not written, and \`latest\` still names memfault/checkpoints/step_00000002.h5" \
  env MPIFORMER_FAULT_NONFINITE_WEIGHTS_SAVE=4 mpirun -np 2 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=4 \
  --set checkpoint.every=2 --set parallel.dp=2 --set run.dir=memfault --set run.peak_tflops=1
[ "$(head -1 memfault/checkpoints/latest)" = step_00000002.h5 ] || fail "latest moved past the good checkpoint"
! ls memfault/checkpoints/step_00000004.h5* >/dev/null 2>&1 || fail "the non-finite checkpoint was written"
# The same in a background save on the way: its snapshot's copy scans
# what it copies.
expect 2 "the weights of step 4 hold NaN or infinity: this checkpoint is not written, and \`latest\` still names memfault_async/checkpoints/step_00000002.h5" \
  env MPIFORMER_FAULT_NONFINITE_WEIGHTS_SAVE=4 mpirun -np 2 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=6 \
  --set checkpoint.every=2 --set checkpoint.async=true --set parallel.dp=2 --set run.dir=memfault_async \
  --set run.peak_tflops=1
[ "$(head -1 memfault_async/checkpoints/latest)" = step_00000002.h5 ] || fail "latest moved past the good checkpoint (async)"
! ls memfault_async/checkpoints/step_00000004.h5* >/dev/null 2>&1 || fail "the non-finite checkpoint was written (async)"

# 2. Sizes read from weight files and checkpoints are held to the deck's
# limits before anything is sized from them (exit 2 naming file and field).
H5PY=/usr/bin/python3  # Debian's, with h5py (.ci/deps.sh)
cp -r nan_hf big_layer
"$MPIFORMER" export "$CK" --format hf --output good_hf >/dev/null || fail "export hf"
add_tensor() {  # add_tensor DIR NAME: one more 1-element tensor in DIR/model.safetensors
  python3 - "$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
path, name = sys.argv[1:]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:8 + n + end] + b"\0\0\0\0")
PY
}
init_run() { mpirun -np 1 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=1 --set "model.init=\"$1\"" --set run.dir="run_$1" --set run.peak_tflops=1; }
cp -r good_hf layer_huge && add_tensor layer_huge transformer.h.2147483648.ln_1.weight
expect 2 "transformer.h.2147483648.ln_1.weight: a layer number beyond any model's" init_run layer_huge
cp -r good_hf layer_big && rm layer_big/config.json && add_tensor layer_big transformer.h.5000.ln_1.weight
expect 2 "layer_big/model.safetensors: the weights' n_layer: 5001, outside [1, 1024]" init_run layer_big
cp -r good_hf head_neg && sed -i 's/"n_head": [0-9]*/"n_head": -1/' head_neg/config.json
expect 2 "head_neg/config.json: n_head: -1, outside [1, 1024]" init_run head_neg
# An llm.c header whose products overflow int64 to exactly its 1,024 bytes.
python3 - overflow.bin <<'PY'
import struct, sys
h = [20240326, 3, 1024, 50257, 2**30, 12, 768, 50304] + [0] * 248
open(sys.argv[1], "wb").write(struct.pack("<256i", *h))
PY
expect 2 "overflow.bin: header n_layer: 1073741824, outside [1, 1024]" init_run overflow.bin

# 9. An old-format checkpoint (version 1: no checksum over its attributes)
# whose shape attributes lie: refused beyond the limits, and within them
# inspected in bounded memory (each tensor's shape checked, nothing missed).
cp "$CK" v1_huge.h5 && "$H5_DAMAGE" setint v1_huge.h5 format_version 1 && "$H5_DAMAGE" setint v1_huge.h5 n_embd 1000000000
expect 2 "v1_huge.h5: attribute n_embd: 1000000000, outside [1, 65536]" "$MPIFORMER" inspect v1_huge.h5
cp "$CK" v1_false.h5 && "$H5_DAMAGE" setint v1_false.h5 format_version 1 && "$H5_DAMAGE" setint v1_false.h5 n_embd 65536 &&
  "$H5_DAMAGE" setint v1_false.h5 vocab_size 16000000
rc=0
(ulimit -v 4000000; timeout 120 "$MPIFORMER" inspect v1_false.h5 >v1.txt 2>&1) || rc=$?
[ "$rc" -eq 2 ] || { tail -5 v1.txt; fail "inspect of a v1 checkpoint with false shapes: exit $rc, expected 2"; }
grep -q "DAMAGED:     /model/wte: shape \[256, 128\], the deck's model needs \[16000000, 65536\]" v1.txt ||
  { tail -5 v1.txt; fail "the false shape is not named"; }
echo "ok: a v1 checkpoint with false shapes is inspected in bounded memory and refused"

# 8. A checkpoint whose /model/wte is an external link into another run's
# file: inspect and resume refuse it alike. A `latest` naming a .tmp is
# not read: resume falls back to the complete checkpoints.
run_mpi 1 train "$DECK" $SMALL_BATCH --set train.steps=2 --set train.eval_every=0 --set train.seed=7 --set run.dir=other >other.log 2>&1 ||
  { cat other.log; fail "the other run failed"; }
mkdir -p linked/checkpoints && cp "$CK" linked/checkpoints/step_00000002.h5
echo step_00000002.h5 >linked/checkpoints/latest
$H5PY - linked/checkpoints/step_00000002.h5 "$WORK/other/checkpoints/step_00000002.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["/model/wte"]
    f["/model/wte"] = h5py.ExternalLink(sys.argv[2], "/model/wte")
PY
expect 2 "/model/wte: /model/wte is an external link (into another file)" "$MPIFORMER" inspect linked/checkpoints/step_00000002.h5
expect 2 "/model/wte: /model/wte is an external link (into another file)" \
  mpirun -np 1 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=4 --set run.dir=linked --set run.peak_tflops=1
mkdir -p tmpnamed/checkpoints && cp "$CK" tmpnamed/checkpoints/step_00000002.h5 &&
  cp "$CK" tmpnamed/checkpoints/step_00000003.h5.tmp && echo step_00000003.h5.tmp >tmpnamed/checkpoints/latest
run_mpi 1 train "$DECK" $SMALL_BATCH --set train.steps=4 --set train.eval_every=0 --set run.dir=tmpnamed >tmpnamed.log 2>&1 ||
  { cat tmpnamed.log; fail "resume with a latest naming a .tmp"; }
grep -q 'latest: names "step_00000003.h5.tmp", which is not a complete checkpoint' tmpnamed.log ||
  { cat tmpnamed.log; fail "no warning about the .tmp"; }
grep -q "resumed from tmpnamed/checkpoints/step_00000002.h5" tmpnamed.log || { cat tmpnamed.log; fail "did not fall back"; }
echo "ok: a latest naming a .tmp is not read"

# 7. FIFOs and links where a file is read: refused, never waited on.
cp -r good_hf fifo_cfg && rm fifo_cfg/config.json && mkfifo fifo_cfg/config.json
expect 2 "fifo_cfg/config.json: not a regular file (a FIFO or a device?)" init_run fifo_cfg
cp -r good_hf dir_cfg && rm dir_cfg/config.json && mkdir dir_cfg/config.json
expect 2 "dir_cfg/config.json: a directory, not a GPT-2 config.json" init_run dir_cfg
mkdir -p fifo_latest/checkpoints && cp "$CK" fifo_latest/checkpoints/step_00000002.h5 && mkfifo fifo_latest/checkpoints/latest
rc=0
timeout 120 mpirun -np 1 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=3 --set train.eval_every=0 \
  --set run.dir=fifo_latest --set run.peak_tflops=1 >fifo_latest.log 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat fifo_latest.log; fail "a FIFO as latest: exit $rc"; }
grep -q "resumed from fifo_latest/checkpoints/step_00000002.h5" fifo_latest.log || { cat fifo_latest.log; fail "no fallback"; }
mkfifo fifo.h5
cp "$CK" fifo_link.h5
$H5PY - fifo_link.h5 "$WORK/fifo.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["/model/wte"]
    f["/model/wte"] = h5py.ExternalLink(sys.argv[2], "/x")
PY
expect 2 "/model/wte is an external link" "$MPIFORMER" inspect fifo_link.h5
mkdir -p fifo_metrics && mkfifo fifo_metrics/metrics.jsonl
expect 2 "fifo_metrics/metrics.jsonl: [run] dir: not a regular file" \
  mpirun -np 1 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=2 --set run.dir=fifo_metrics --set run.peak_tflops=1
echo "ok: FIFOs and links are refused without waiting"

# 10. Foreign HDF5 token datasets: a virtual dataset whose source is
# missing, an LZF-compressed one (h5py's own filter) are refused when
# opened; an h5py file with a user block is read.
$H5PY - <<'PY'
import h5py, numpy as np
tokens = (np.arange(20000) % 250).astype(np.uint16)
def write(name, **kw):
    with h5py.File(name, "w", **{k: v for k, v in kw.items() if k == "userblock_size"}) as f:
        if "lzf" in kw: f.create_dataset("tokens", data=tokens, compression="lzf", chunks=(4096,))
        elif "vds" in kw:
            layout = h5py.VirtualLayout(shape=tokens.shape, dtype=np.uint16)
            layout[:] = h5py.VirtualSource("missing_source.h5", "tokens", shape=tokens.shape)
            f.create_virtual_dataset("tokens", layout, fillvalue=7)
        else: f["tokens"] = tokens
        f.attrs["vocab_size"] = 256
        f.attrs["tokenizer"] = "byte"
write("lzf.h5", lzf=True)
write("vds.h5", vds=True)
write("userblock.h5", userblock_size=512)
with h5py.File("huge.h5", "w") as f:  # 10^12 tokens declared in an 8 KB file
    f.create_dataset("tokens", shape=(10**12,), dtype=np.uint16)
    f.attrs["vocab_size"] = 256
    f.attrs["tokenizer"] = "byte"
with h5py.File("holes.h5", "w") as f:  # chunked, the last chunk never written
    d = f.create_dataset("tokens", shape=(40000,), dtype=np.uint16, chunks=(4096,))
    d[:36864] = tokens[:36864] if len(tokens) >= 36864 else np.resize(tokens, 36864)
    f.attrs["vocab_size"] = 256
    f.attrs["tokenizer"] = "byte"
with h5py.File("range.h5", "w") as f:  # ids past vocab_size, and no max_token_id to say so
    bad = tokens.copy()
    bad[100:] = 300
    f["tokens"] = bad
    f.attrs["vocab_size"] = 256
    f.attrs["tokenizer"] = "byte"
PY
data_run() { mpirun -np 1 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set train.steps=2 --set "data.train=\"$1\"" --set 'data.val=""' --set run.dir="run_$1" --set run.peak_tflops=1; }
expect 2 "vds.h5: /tokens: a virtual dataset" data_run vds.h5
expect 2 "lzf.h5: /tokens: compressed with filter 32000" data_run lzf.h5
data_run userblock.h5 >userblock.log 2>&1 || { cat userblock.log; fail "an h5py file with a user block was refused"; }
expect 2 "huge.h5: /tokens: declares 1000000000000 values but stores 0 bytes" data_run huge.h5
expect 2 "huge.h5: /tokens: declares 1000000000000 values" "$MPIFORMER" inspect huge.h5
expect 2 "holes.h5: /tokens: 9 of its 10 chunks were written" data_run holes.h5
# Out-of-range ids met while training, by the rank that read them: bad
# input all the same (exit 2, never restarted), not a fatal error (3).
expect 2 "range.h5" data_run range.h5
grep -q "mpiformer: error (met by rank 0): .*range.h5" err.txt || { cat err.txt; fail "out-of-range ids: no error line"; }
echo "ok: foreign HDF5: virtual, LZF, unallocated and partly written datasets refused, a user block read, out-of-range ids exit 2"

# 5. Ranks that each read their own slices of [model] init agree they read
# the same content: here rank 1 sees another model at the same path
# (/proc/self/cwd resolves to each rank's own directory, as a node-local
# copy would), and the job is refused before it trains on a mix of both.
mkdir -p rankA rankB
"$MPIFORMER" export "$CK" --format llmc --output rankA/model.bin >/dev/null || fail "export llmc"
"$MPIFORMER" export other/checkpoints/step_00000002.h5 --format llmc --output rankB/model.bin >/dev/null || fail "export llmc"
two_dirs() {
  local a=(train "$DECK" $SMALL_BATCH --set parallel.dp=2 --set train.steps=1 --set 'model.init="/proc/self/cwd/model.bin"'
           --set "data.train=\"$WORK/data/tinyshakespeare_byte.h5\"" --set "data.val=\"\""
           --set "run.dir=\"$WORK/$1\"" --set run.peak_tflops=1)
  mpirun -np 1 --wdir "$WORK/rankA" "$MPIFORMER" "${a[@]}" : -np 1 --wdir "$WORK/$2" "$MPIFORMER" "${a[@]}"
}
expect 2 "/proc/self/cwd/model.bin: [model] init: differs between ranks" two_dirs mixed rankB
cp rankA/model.bin rankB/model.bin
two_dirs same rankB >same.log 2>&1 || { cat same.log; fail "identical copies at the same path were refused"; }
echo "ok: ranks reading different [model] init files are refused; identical copies pass"

# 11. A save killed part-way leaves its .tmp; the next start (holding the
# directory's lock) removes it and resumes from the last complete one.
rc=0
MPIFORMER_CHECKPOINT_FAULT_AFTER=20 mpirun -np 2 "$MPIFORMER" train "$DECK" $SMALL_BATCH --set parallel.dp=2 --set train.steps=4 \
  --set train.eval_every=0 --set checkpoint.every=2 --set run.dir=killed_save --set run.peak_tflops=1 \
  >killed_save.log 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "the injected fault did not end the save"
ls killed_save/checkpoints/step_*.h5.tmp >/dev/null 2>&1 || fail "no partial save to clean (the fault hook did not fire)"
run_mpi 2 train "$DECK" $SMALL_BATCH --set parallel.dp=2 --set train.steps=4 --set train.eval_every=0 --set checkpoint.every=2 \
  --set run.dir=killed_save >killed_save2.log 2>&1 || { cat killed_save2.log; fail "the restart failed"; }
grep -q "removed 1 unfinished save(s) (.tmp) an earlier job left" killed_save2.log || { cat killed_save2.log; fail "no cleanup line"; }
! ls killed_save/checkpoints/*.tmp >/dev/null 2>&1 || fail "a .tmp is still there"
echo "ok: an unfinished save's .tmp is removed at the next start"
