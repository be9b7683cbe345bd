#!/usr/bin/env bash
# prep's speed on a corpus that does not repeat: the source files, headers
# and documentation this machine already has (Python's library, /usr/include,
# /usr/share/doc, CUDA's headers), each distinct file (by content) one
# document, as JSON lines in 16 shards, cut at MB megabytes (default 220).
# Tiny Shakespeare repeated would not do: the GPT-2 word cache would make
# it look fast. For byte, gpt2 and sentencepiece (a model of 8000 pieces
# spm_train makes here from 20 MB of the files' lines), prep on 1 and 2 ranks: MB/s of input
# (JSON) per rank, the speed-up, and the peak memory of the one-rank run.
#   PRESET=cpu  MB=220  DIR=bench-out/prep
source "$(dirname "$0")/lib.sh"
MB=${MB:-220}
DIR=${DIR:-bench-out/prep}
mkdir -p "$DIR"
echo "== $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
if [ ! -f "$DIR/corpus/done" ]; then
  rm -rf "$DIR/corpus" && mkdir -p "$DIR/corpus"
  find /usr/lib/python3 /usr/lib/python3.11 /usr/include /usr/share/doc /usr/local/cuda/include \
    -type f \( -name '*.py' -o -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cc' \
    -o -name '*.txt' -o -name '*.md' -o -name '*.rst' -o -name '*.html' \) -size -4M 2>/dev/null |
    sort >"$DIR/files.txt"
  python3 - "$DIR/files.txt" "$DIR/corpus" "$MB" <<'PY'
import hashlib, json, sys
files, out, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]) * 10**6
seen, docs, size = set(), [], 0
for path in open(files).read().split("\n"):
    if not path:
        continue
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    h = hashlib.sha1(data).digest()
    if h in seen or not data:
        continue
    seen.add(h)
    line = json.dumps({"text": data.decode("utf-8", "replace"), "path": path}, ensure_ascii=False) + "\n"
    docs.append(line)
    size += len(line.encode())
    if size >= limit:
        break
shards = [open(f"{out}/shard{i:02d}.jsonl", "w") for i in range(16)]
for i, line in enumerate(docs):
    shards[i * 16 // len(docs)].write(line)
for f in shards:
    f.close()
print(f"corpus: {len(docs)} distinct files, {size / 1e6:.1f} MB of JSON lines in 16 shards")
PY
  touch "$DIR/corpus/done"
fi
du -sm "$DIR/corpus" | awk '{print "corpus on disk: " $1 " MB"}'
if [ ! -f "$DIR/sp.model" ]; then
  # Trained on the files' own lines (a JSON line is one long sentence).
  tr '\n' '\0' <"$DIR/files.txt" | xargs -0 cat 2>/dev/null | head -c 20000000 >"$DIR/sp_train.txt" || true
  spm_train --input="$DIR/sp_train.txt" --model_prefix="$DIR/sp" --vocab_size=8000 \
    --input_sentence_size=300000 --shuffle_input_sentence=true --minloglevel=2 >"$DIR/spm.log" 2>&1 ||
    { tail -3 "$DIR/spm.log"; exit 1; }
fi
for tok in byte gpt2 sentencepiece; do
  extra=()
  [ "$tok" = sentencepiece ] && extra=(--tokenizer-model "$DIR/sp.model")
  /usr/bin/time -f "%M" -o "$DIR/rss.txt" "$BIN" prep --tokenizer "$tok" "${extra[@]}" \
    --output "$DIR/$tok.1.h5" "$DIR"/corpus/*.jsonl >"$DIR/$tok.1.log" 2>&1
  mpirun -np 2 "$BIN" prep --tokenizer "$tok" "${extra[@]}" --output "$DIR/$tok.2.h5" \
    "$DIR"/corpus/*.jsonl >"$DIR/$tok.2.log" 2>&1
  h5diff "$DIR/$tok.1.h5" "$DIR/$tok.2.h5" >/dev/null || echo "$tok: 2 ranks wrote another dataset!"
  python3 - "$tok" "$DIR/$tok.1.log" "$DIR/$tok.2.log" "$(cat "$DIR/rss.txt")" <<'PY'
import re, sys
def rate(path):
    m = re.search(r"prep: ([0-9.]+) MB of text, ([0-9]+) documents, ([0-9]+) tokens in ([0-9.]+) s on (\d+) rank", open(path).read())
    mb, docs, tokens, s, n = float(m[1]), int(m[2]), int(m[3]), float(m[4]), int(m[5])
    return mb, tokens, s, mb / s
mb, tokens, s1, r1 = rate(sys.argv[2])
_, _, s2, r2 = rate(sys.argv[3])
print(f"{sys.argv[1]:>13}: {mb:.0f} MB, {tokens / 1e6:.1f} M tokens | 1 rank {s1:.1f} s, {r1:.2f} MB/s "
      f"| 2 ranks {s2:.1f} s, {r2:.2f} MB/s ({r2 / 2:.2f} per rank) | speed-up {s1 / s2:.2f}x "
      f"| peak RSS of 1 rank {int(sys.argv[4]) / 1024:.0f} MB")
PY
  rm -f "$DIR/$tok".[12]*.h5
done
