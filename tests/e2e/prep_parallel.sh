#!/usr/bin/env bash
# prep on several ranks. (1) The same dataset, byte for byte (h5diff:
# tokens, documents, labels), on 1, 2 and 3 ranks, for byte and gpt2 tokens,
# from a large file the ranks split at the tokenizer's cuts, small files,
# a gzip'd file and JSON lines (zstd), with a validation split. (2)
# Compressed text gives its plain text's tokens. (3) A bad JSON line stops
# prep naming the file and line (on every rank), or is counted with
# --skip-bad-lines; a cut gzip file is named. (4) Nothing is left beside
# the output.
source "$(dirname "$0")/lib.sh"
text="$SOURCE_DIR/inputs/tinyshakespeare.txt"
cat "$text" "$text" "$text" >big.txt  # 3.3 MB: units cut inside it
head -c 3000 "$text" >small.txt
tail -c 200000 "$text" >part.txt
gzip -k part.txt
python3 - "$text" <<'PY'
import json, sys
paras = open(sys.argv[1]).read().split("\n\n")[:400]
with open("docs.jsonl", "w") as f:
    for i, p in enumerate(paras):
        f.write(json.dumps({"id": i, "text": p + "\n"}) + "\n")
PY
zstd -q docs.jsonl -o docs.jsonl.zst
inputs=(small.txt big.txt part.txt.gz docs.jsonl.zst)
for tok in byte gpt2; do
  for np in 1 2 3; do
    run_mpi "$np" prep --tokenizer "$tok" --val-fraction 0.05 --output "$tok$np.h5" "${inputs[@]}" \
      >"$tok$np.log" 2>&1 || { cat "$tok$np.log"; fail "prep $tok on $np ranks"; }
  done
  for np in 2 3; do
    for f in "" _val; do
      h5diff "${tok}1$f.h5" "$tok$np$f.h5" >/dev/null || fail "$tok: $np ranks wrote another $tok$np$f.h5"
    done
  done
  count() { h5dump -H -d /documents "$1" | grep -o 'SIMPLE { ( [0-9]*' | grep -o '[0-9]*$'; }
  # 3 text files and 400 lines; the split cut into one, which goes on as
  # the validation file's first.
  docs=$(( $(count "${tok}1.h5") + $(count "${tok}1_val.h5") ))
  [ "$docs" -eq 404 ] || fail "$tok: $docs documents recorded, expected 403 and the one the split cut"
  echo "$tok: 1, 2 and 3 ranks wrote the same dataset ($docs documents); $(grep '^prep:' "${tok}3.log")"
done

# (2) Compressed text is its text.
run_mpi 1 prep --tokenizer gpt2 --output plain.h5 part.txt >/dev/null 2>&1 || fail "prep part.txt"
run_mpi 1 prep --tokenizer gpt2 --output gz.h5 part.txt.gz >/dev/null 2>&1 || fail "prep part.txt.gz"
h5diff plain.h5 gz.h5 >/dev/null || fail "gzip'd text gave other tokens"
echo "gzip: the plain text's tokens"

# (3) Bad lines, a cut file.
cp docs.jsonl bad.jsonl
sed -i '123s/.*/{"id": 122, "text": 5}/' bad.jsonl
rc=0
run_mpi 2 prep --output bad.h5 bad.jsonl >bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat bad.log; fail "a bad JSON line: exit $rc, expected 2"; }
has -F 'bad.jsonl: line 123: no string field "text"' bad.log || { cat bad.log; fail "no file and line"; }
[ "$(grep -c 'mpiformer: error' bad.log)" -eq 1 ] || fail "the error should be printed once"
[ ! -e bad.h5 ] || fail "a failed prep left bad.h5"
run_mpi 2 prep --skip-bad-lines --output skip.h5 bad.jsonl >skip.log 2>&1 || { cat skip.log; fail "skip"; }
has -F "1 bad JSON line(s) skipped" skip.log || { cat skip.log; fail "the skipped line is not counted"; }
head -c 30000 part.txt.gz >cut.txt.gz
rc=0
run_mpi 1 prep --output cut.h5 cut.txt.gz >cut.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && has -F "cut.txt.gz: gzip data ends inside a member" cut.log ||
  { cat cut.log; fail "a cut gzip file: exit $rc"; }
echo "bad inputs: named (file and line), counted with --skip-bad-lines"

# (4) No scratch file stays.
if ls ./*.tmp 2>/dev/null | grep -q .; then ls ./*.tmp; fail "scratch files left"; fi
echo "no scratch files left"
