#!/usr/bin/env bash
# What a probe with hostile inputs and faults found (issue 25, part 3): each
# case ends with one clear message and a non-zero exit, and leaves every
# input as it was.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
# expect RC "message part" CMD...: exit RC (any non-zero when RC is "fail")
# within 120 s, with that text on stderr.
expect() {
  local want_rc=$1 want=$2 rc=0
  shift 2
  timeout 120 "$@" >out.txt 2>err.txt </dev/null || rc=$?
  [ "$rc" -ne 124 ] || fail "hung (timeout) for: $*"
  if [ "$want_rc" = fail ]; then [ "$rc" -ne 0 ] || fail "exit 0 for: $*"
  else [ "$rc" -eq "$want_rc" ] || { cat err.txt >&2; fail "exit $rc, expected $want_rc, for: $*"; }; fi
  grep -qF -- "$want" err.txt || { cat err.txt >&2; fail "no '$want' in the error for: $*"; }
  echo "ok: $want"
}
unchanged() {  # unchanged FILE SUM: the file's checksum is still SUM
  [ "$(sha256sum <"$1")" = "$2" ] || fail "$1 was modified"
}
run_mpi 1 train "$DECK" --set train.steps=2 --set train.eval_every=0 --set run.dir=small >small.log 2>&1 ||
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
  mpirun -np 2 "$MPIFORMER" train "$DECK" --set train.steps=2 --set 'model.init="nan_hf"' \
  --set 'train.nonfinite="skip"' --set parallel.dp=2 --set run.dir=nan_init --set run.peak_tflops=1
[ ! -e nan_init/checkpoints/latest ] || fail "a run from NaN weights published a checkpoint"
expect 2 "the weights of step 4 hold NaN or infinity: this checkpoint is not written, and \`latest\` still names memfault/checkpoints/step_00000002.h5" \
  env MPIFORMER_FAULT_NONFINITE_WEIGHTS_SAVE=4 mpirun -np 2 "$MPIFORMER" train "$DECK" --set train.steps=4 \
  --set checkpoint.every=2 --set parallel.dp=2 --set run.dir=memfault --set run.peak_tflops=1
[ "$(head -1 memfault/checkpoints/latest)" = step_00000002.h5 ] || fail "latest moved past the good checkpoint"
! ls memfault/checkpoints/step_00000004.h5* >/dev/null 2>&1 || fail "the non-finite checkpoint was written"
