#!/usr/bin/env bash
# Numbers and options that cannot work, refused before any work (exit 2,
# the option named): NaN for --temperature and --max-shard-mb (outside
# every range); generate --logits into a folder that does not exist (found
# before generating, not after); generate --tokenizer-model for a
# checkpoint whose data was not SentencePiece's (prep refuses the same);
# prep of a FIFO with no writer (it blocked forever). And a Mixture of
# Experts' training choices (capacity_factor, aux_loss) changed on resume:
# allowed, and the log says so.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
run_mpi 1 train "$DECK" --set train.steps=2 --set train.eval_every=0 --set run.dir=src \
  >src.log 2>&1 || { cat src.log; fail "training"; }
ck=src/checkpoints/step_00000002.h5

refused() {  # label expected-text command...
  local label=$1 want=$2 rc=0
  shift 2
  timeout 20 "$@" >"$label.out" 2>"$label.err" || rc=$?
  [ "$rc" = 2 ] || { cat "$label.out" "$label.err"; fail "$label: exit $rc, expected 2"; }
  grep -qF -- "$want" "$label.err" || { cat "$label.err"; fail "$label: the message does not say: $want"; }
}
refused temp_nan "--temperature: expected a number in [0, 100], got nan" "$MPIFORMER" generate "$ck" --temperature nan
refused shard_nan "--max-shard-mb: expected a number in [0.001, 1e+09], got nan" \
  "$MPIFORMER" export "$ck" --format hf --max-shard-mb nan --output hfnan
[ ! -e hfnan ] || fail "export wrote something"
refused logits_dir "--logits" "$MPIFORMER" generate "$ck" --tokens 50 --logits no/such/dir/x.bin
[ ! -s logits_dir.out ] || { cat logits_dir.out; fail "--logits into a missing folder: generated first"; }
refused spm_model "--tokenizer-model: given, but the data was tokenized by byte" \
  "$MPIFORMER" generate "$ck" --tokenizer-model "$SOURCE_DIR/inputs/tiny.toml"
mkfifo pipe
refused fifo "pipe: not a regular file" "$MPIFORMER" prep --tokenizer byte --output f.h5 pipe
echo "ok: NaN options, a --logits folder that does not exist, a stray --tokenizer-model and a FIFO refused before any work"

# A Mixture of Experts resumed with other training choices.
MOE="$SOURCE_DIR/inputs/llama-moe-tiny.toml"
moe=(--set train.steps=4 --set train.eval_every=0 --set checkpoint.every=2 --set run.dir=moe
     --set train.global_batch=4 --set train.micro_batch=4)
run_mpi 1 train "$MOE" "${moe[@]}" --set train.steps=2 >moe1.log 2>&1 || { cat moe1.log; fail "moe"; }
run_mpi 1 train "$MOE" "${moe[@]}" --set model.capacity_factor=2.0 --set model.aux_loss=0.02 \
  >moe2.log 2>&1 || { cat moe2.log; fail "moe resume"; }
grep -q "resume: \[model\] capacity_factor changes from 1.25 (the checkpoint's run) to 2" moe2.log &&
  grep -q "resume: \[model\] aux_loss changes from 0.01 (the checkpoint's run) to 0.02" moe2.log ||
  { cat moe2.log; fail "the changed training choices are not said"; }
echo "ok: a Mixture of Experts' capacity_factor and aux_loss may change on resume, and the log says so"
