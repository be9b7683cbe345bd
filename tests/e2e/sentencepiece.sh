#!/usr/bin/env bash
# SentencePiece tokens (Llama 2's kind) through Debian's libsentencepiece:
# a model trained here by Debian's spm_train on the sample corpus (nothing
# downloaded); prep's ids equal spm_encode's (the reference: the upstream
# command-line tool, reading the text itself) after the BOS each document
# starts with; the Llama deck trains on them (vocabulary from the data),
# generate decodes with the model file and refuses a missing or different
# one; bad models are named (exit 2) with nothing written.
source "$(dirname "$0")/lib.sh"
command -v spm_train >/dev/null || fail "no spm_train (.ci/deps.sh installs sentencepiece)"
corpus="$SOURCE_DIR/inputs/tinyshakespeare.txt"
spm_train --input="$corpus" --model_prefix=shake --vocab_size=512 --model_type=bpe \
  --character_coverage=1.0 --input_sentence_size=20000 --shuffle_input_sentence=false \
  --minloglevel=2 >spm.log 2>&1 || { cat spm.log; fail "spm_train"; }
# Another model, for the refusal below.
spm_train --input="$corpus" --model_prefix=other --vocab_size=300 --model_type=unigram \
  --input_sentence_size=5000 --shuffle_input_sentence=false --minloglevel=2 >>spm.log 2>&1 ||
  { cat spm.log; fail "spm_train (other)"; }

# same_ids H5 TEXT WHAT: prep's document in H5 is a BOS, then spm_encode's
# ids of TEXT (the reference: the upstream tool, which encodes line by line).
same_ids() {
  spm_encode --model=shake.model --output_format=id <"$2" >"$2.ids"
  /usr/bin/python3 - "$1" "$2.ids" "$3" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    got = [int(t) for t in f["tokens"][()]]
    vocab, tok = int(f.attrs["vocab_size"]), f.attrs["tokenizer"]
    tok = tok.decode() if isinstance(tok, bytes) else tok
want = [int(t) for t in open(sys.argv[2]).read().split()]
assert vocab == 512 and tok.startswith("sentencepiece:"), (vocab, tok)
assert got[0] == 1, f"the document starts with {got[0]}, not BOS (1)"
first = next((i for i, (a, b) in enumerate(zip(got[1:], want)) if a != b), min(len(got) - 1, len(want)))
assert got[1:] == want, \
    f"{sys.argv[3]}: prep's ids differ from spm_encode's: {len(got) - 1} vs {len(want)}, first at {first}"
print(f"{sys.argv[3]}: {len(want)} ids equal spm_encode's, after BOS")
PY
}

# prep's ids against spm_encode's, on one line (prep encodes a file as one
# document, so one line keeps the two comparable).
head -c 20000 "$corpus" | tr '\n' ' ' >line.txt
mkdir -p data
"$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model shake.model --output data/line.h5 \
  line.txt >prep.log 2>&1 || { cat prep.log; fail "prep"; }
same_ids data/line.h5 line.txt "one line"
# A document over 1 MiB is encoded in pieces cut after a line's end
# (bounded memory): lines of ~600 KB make each piece one line, so the ids
# are spm_encode's of each line, one after another.
"$PY" - "$corpus" <<'PY'
import sys
words = open(sys.argv[1]).read().split()
line = " ".join(words)[:600000]
open("long.txt", "w").write((line + "\n") * 3)
PY
"$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model shake.model --output data/long.h5 \
  long.txt >prep_long.log 2>&1 || { cat prep_long.log; fail "prep of a long document"; }
same_ids data/long.h5 long.txt "prep in pieces of 1 MiB"
# Ranks that split the document at the tokenizer's cuts write the same ids.
for np in 2 3; do
  run_mpi "$np" prep --tokenizer sentencepiece --tokenizer-model shake.model \
    --output "data/long$np.h5" long.txt >"prep_long$np.log" 2>&1 ||
    { cat "prep_long$np.log"; fail "prep of a long document on $np ranks"; }
  h5diff data/long.h5 "data/long$np.h5" >/dev/null || fail "prep on $np ranks wrote other ids"
done
echo "prep of the long document on 2 and 3 ranks: the same dataset"
# Memory stays bounded whatever the document: a 12 MB single line (the
# library alone held about 120 bytes a byte of it: 1.4 GB) prepped in
# under 700 MB.
"$PY" - long.txt "$MPIFORMER" shake.model <<'PY'
import resource, subprocess, sys
line = open(sys.argv[1]).readline().rstrip("\n")
open("huge.txt", "w").write(" ".join([line] * 20))
subprocess.run([sys.argv[2], "prep", "--tokenizer", "sentencepiece", "--tokenizer-model", sys.argv[3],
                "--output", "data/huge.h5", "huge.txt"], check=True, stdout=subprocess.DEVNULL)
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
assert peak_mb < 700, f"prep of a 12 MB line peaked at {peak_mb:.0f} MB"
print(f"prep of a 12 MB line: peak {peak_mb:.0f} MB")
PY

# The Llama deck on SentencePiece tokens: the vocabulary (512) from the data.
"$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model shake.model --val-fraction 0.1 \
  --output data/shake.h5 "$corpus" >prep.log 2>&1 || { cat prep.log; fail "prep corpus"; }
run_mpi 2 train "$SOURCE_DIR/inputs/llama-tiny.toml" --set data.train=data/shake.h5 \
  --set data.val=data/shake_val.h5 --set parallel.dp=2 --set train.steps=4 \
  --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_every=4 \
  --set train.eval_batches=1 --set run.dir=run >train.log 2>&1 || { cat train.log; fail "train"; }
grep -q "vocab 512" train.log || { cat train.log; fail "vocabulary not taken from the data"; }
ck=run/checkpoints/step_00000004.h5
"$MPIFORMER" generate "$ck" --tokenizer-model shake.model --prompt "ROMEO:" --tokens 8 \
  --temperature 0 >gen.txt 2>gen.err || { cat gen.err; fail "generate"; }
grep -q "^ROMEO:" gen.txt || { cat gen.txt; fail "generate: no text"; }

# A Megatron dataset of the same tokens has no label: GPT-2's is assumed,
# and the validation set (which records SentencePiece's) is refused beside
# it; [data] vocab_size and tokenizer give the label, and it trains.
"$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model shake.model --format megatron \
  --output data/shake_mg.bin "$corpus" >prep.log 2>&1 || { cat prep.log; fail "prep megatron"; }
sp_name=$(grep -o "tokenizer sentencepiece:[0-9a-f]*" prep.log | cut -d' ' -f2)
[ -n "$sp_name" ] || { cat prep.log; fail "prep does not name the tokenizer"; }
mg=(--set data.train=data/shake_mg.bin --set data.val=data/shake_val.h5 --set train.steps=2
    --set train.global_batch=8 --set train.micro_batch=4 --set train.eval_every=2 --set train.eval_batches=1)
rc=0
run_mpi 1 train "$SOURCE_DIR/inputs/llama-tiny.toml" "${mg[@]}" --set run.dir=mg_unlabelled \
  >mg1.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "differs from data/shake_mg.bin's \"gpt2\"" mg1.log ||
  { cat mg1.log; fail "an unlabelled Megatron set beside a SentencePiece one was not refused (exit $rc)"; }
run_mpi 1 train "$SOURCE_DIR/inputs/llama-tiny.toml" "${mg[@]}" --set run.dir=mg_labelled \
  --set data.vocab_size=512 --set data.tokenizer="$sp_name" >mg2.log 2>&1 || { cat mg2.log; fail "labelled"; }
grep -q "vocab 512" mg2.log || { cat mg2.log; fail "the deck's vocabulary was not taken"; }
rc=0
run_mpi 1 train "$SOURCE_DIR/inputs/llama-tiny.toml" "${mg[@]}" --set run.dir=mg_wrong \
  --set data.vocab_size=600 >mg3.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "data/shake_val.h5: [data] vocab_size: 600, but the file's vocab_size attribute is 512" mg3.log ||
  { cat mg3.log; fail "a label that contradicts the file's was not refused (exit $rc)"; }
echo "ok: the deck labels a Megatron dataset"

refused() {  # label want command...
  local label=$1 want=$2 rc=0
  shift 2
  "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$want" err.txt || { cat err.txt; fail "$label (exit $rc)"; }
  echo "ok: $label refused"
}
refused "generate without the model" "--tokenizer-model: missing: the data was tokenized by sentencepiece:" \
  "$MPIFORMER" generate "$ck" --prompt "A"
refused "generate with another model" "but the data was tokenized by sentencepiece:" \
  "$MPIFORMER" generate "$ck" --tokenizer-model other.model --prompt "A"
head -c 1000 "$corpus" >notamodel.model
refused "prep with a bad model" "notamodel.model: --tokenizer-model: not a SentencePiece model" \
  "$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model notamodel.model --output data/bad.h5 line.txt
[ ! -e data/bad.h5 ] || fail "a refused prep wrote its output"
refused "prep without a model" "--tokenizer-model: missing" \
  "$MPIFORMER" prep --tokenizer sentencepiece --output data/bad.h5 line.txt
before=$(md5sum <shake.model)
refused "a model that is also the output" "is both an input and --output" \
  "$MPIFORMER" prep --tokenizer sentencepiece --tokenizer-model shake.model --output shake.model line.txt
[ "$(md5sum <shake.model)" = "$before" ] || fail "the refused prep changed the model file"
echo "ok: sentencepiece"
