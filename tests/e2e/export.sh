#!/usr/bin/env bash
# `mpiformer export` against an independent reader (gpt2_numpy.py: numpy,
# the formats read from their descriptions, GPT-2's forward written out):
#  - hf: GPT2LMHeadModel's names, shapes and config; the numpy forward of
#    the exported weights gives generate's logits at every generated
#    position (and its greedy tokens); bf16 is fp32 rounded to nearest even;
#  - llmc: llm.c's header and every parameter in its order, equal to the hf
#    export's (fp32 and bf16);
#  - refusals leave nothing behind: an existing output is not touched, a
#    damaged checkpoint is named with exit 2 and no output (nor its .tmp)
#    appears.
source "$(dirname "$0")/lib.sh"
PY=${PYTHON_NUMPY:-/usr/bin/python3}
"$PY" -c "import numpy" 2>/dev/null || fail "$PY has no numpy (.ci/deps.sh installs python3-numpy)"
NUMPY_READER="$SOURCE_DIR/tests/e2e/gpt2_numpy.py"
prep_sample_data
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" --set train.steps=4 --set train.global_batch=16 \
  --set train.micro_batch=8 --set run.dir=run >train.log 2>&1 || { cat train.log; fail "training failed"; }
ckpt=run/checkpoints/step_00000004.h5

for dtype in fp32 bf16; do
  "$MPIFORMER" export "$ckpt" --format hf --dtype "$dtype" --output "hf_$dtype" >>export.log ||
    { cat export.log; fail "export hf $dtype"; }
  "$MPIFORMER" export "$ckpt" --format llmc --dtype "$dtype" --output "model_$dtype.bin" >>export.log ||
    { cat export.log; fail "export llmc $dtype"; }
done
[ ! -e hf_fp32.tmp ] && [ ! -e model_fp32.bin.tmp ] || fail "temporary names left behind"
"$PY" "$NUMPY_READER" hf hf_fp32
"$PY" "$NUMPY_READER" bf16 hf_fp32 hf_bf16
"$PY" "$NUMPY_READER" llmc model_fp32.bin hf_fp32
"$PY" "$NUMPY_READER" llmc model_bf16.bin hf_bf16 bf16

# generate's logits for 12 greedy tokens after a prompt (byte tokens: the
# text's bytes are the ids).
"$MPIFORMER" generate "$ckpt" --prompt "ROMEO:" --tokens 12 --temperature 0 --logits logits.bin \
  >gen.txt 2>gen.err || { cat gen.err; fail "generate"; }
head -c -1 gen.txt | od -An -tu1 -v >ids.txt  # without generate's final newline
"$PY" "$NUMPY_READER" logits hf_fp32 ids.txt logits.bin

# Refusals.
cp -r hf_fp32 keep
rc=0
"$MPIFORMER" export "$ckpt" --format hf --output hf_fp32 >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "hf_fp32: --output: exists; export never overwrites" err.txt ||
  { cat err.txt; fail "an existing output was not refused (exit $rc)"; }
diff -r keep hf_fp32 >/dev/null || fail "the refused export changed the existing output"
cp "$ckpt" dmg.h5
off=$(h5dump -p -H -d /model/h.2.mlp.c_fc.weight dmg.h5 | sed -n 's/.*OFFSET \([0-9]*\).*/\1/p')
[ -n "$off" ] || fail "could not find the tensor's offset"
printf '\xff' | dd of=dmg.h5 bs=1 seek=$((off + 1000)) conv=notrunc status=none
for format in hf llmc; do
  rc=0
  "$MPIFORMER" export dmg.h5 --format "$format" --output "out_$format" >/dev/null 2>err.txt || rc=$?
  [ "$rc" -eq 2 ] && grep -q "dmg.h5: /model/h.2.mlp.c_fc.weight: checksum mismatch" err.txt ||
    { cat err.txt; fail "$format: the damaged tensor is not named (exit $rc)"; }
  [ ! -e "out_$format" ] && [ ! -e "out_$format.tmp" ] || fail "$format: a damaged export left files"
done
rc=0
"$MPIFORMER" export "$ckpt" --format llmc --output no/such/dir/m.bin >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "no/such/dir/m.bin: --output: its directory .* does not exist" err.txt ||
  { cat err.txt; fail "a missing output directory was not refused (exit $rc)"; }
echo "ok: refusals named, nothing written"

# Run by hand where MPI cannot start (a login node; here Open MPI told to
# use a transport that does not exist): the commands that only read and
# print never start MPI, and work; train needs it, and fails here (which
# shows the environment does keep MPI from starting).
nompi=(env OMPI_MCA_pml=no_such_transport)
"${nompi[@]}" "$MPIFORMER" inspect "$ckpt" >nompi.txt 2>&1 || { cat nompi.txt; fail "inspect needed MPI"; }
"${nompi[@]}" "$MPIFORMER" export "$ckpt" --format llmc --output nompi.bin >nompi.txt 2>&1 ||
  { cat nompi.txt; fail "export needed MPI"; }
cmp -s nompi.bin model_fp32.bin || fail "export without MPI wrote other bytes"
"${nompi[@]}" "$MPIFORMER" generate "$ckpt" --prompt "ROMEO:" --tokens 12 --temperature 0 >nompi.txt 2>nompi.err ||
  { cat nompi.err; fail "generate needed MPI"; }
cmp -s nompi.txt gen.txt || fail "generate without MPI gave other tokens"
"${nompi[@]}" "$MPIFORMER" plan "$SOURCE_DIR/inputs/gpt2-124m.toml" --set train.precision='"bf16"' \
  --machine "$SOURCE_DIR/inputs/machines/dgx-a100-80gb.toml" --ranks 8 >nompi.txt 2>&1 ||
  { cat nompi.txt; fail "plan needed MPI"; }
rc=0
"${nompi[@]}" "$MPIFORMER" train "$SOURCE_DIR/inputs/tiny.toml" --set train.steps=1 --set run.dir=nompi \
  >nompi.txt 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "train ran although MPI could not start: the check above proves nothing"
echo "ok: inspect, export, generate and plan run by hand without MPI"
