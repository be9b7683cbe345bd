#!/usr/bin/env bash
# Megatron-LM indexed datasets, read and written.
#  - A dataset written by this test's own writer (Python's struct, from the
#    format's description: magic, version, dtype code, counts, lengths,
#    byte offsets, document index) holding the sample corpus's byte tokens
#    in several documents trains bit for bit like the HDF5 dataset of the
#    same tokens (the same windows, the same numbers); inspect names it.
#  - `prep --format megatron` writes a pair this test's reader accepts: the
#    tokens of the HDF5 prep, one document per text file.
#  - Damaged or lying indexes are refused, naming the file and the field.
source "$(dirname "$0")/lib.sh"
prep_sample_data
h5dump -d /tokens -b LE -o tokens.u8 data/tinyshakespeare_byte.h5 >/dev/null
python3 - tokens.u8 mine <<'PY'
import struct, sys
tokens = open(sys.argv[1], "rb").read()  # uint8: the byte tokenizer's ids
cuts = [0, 1000, 123457, 500000, len(tokens)]  # four documents
with open(sys.argv[2] + ".bin", "wb") as f:
    f.write(tokens)
sizes = [b - a for a, b in zip(cuts, cuts[1:])]
with open(sys.argv[2] + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, len(sizes), len(sizes) + 1))
    f.write(struct.pack(f"<{len(sizes)}i", *sizes))
    f.write(struct.pack(f"<{len(sizes)}q", *cuts[:-1]))
    f.write(struct.pack(f"<{len(sizes) + 1}q", *range(len(sizes) + 1)))
PY
"$MPIFORMER" inspect mine.bin >inspect.txt || { cat inspect.txt; fail "inspect mine.bin"; }
grep -q "Megatron indexed (uint8, 4 documents)" inspect.txt || { cat inspect.txt; fail "inspect does not name the format"; }
common=(--set train.steps=3 --set train.global_batch=16 --set train.micro_batch=8 --set data.val='""')
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set run.dir=h5 >h5.log 2>&1 || { cat h5.log; fail "hdf5 run"; }
run_mpi 1 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" --set data.train=mine.idx --set run.dir=mm \
  >mm.log 2>&1 || { cat mm.log; fail "megatron run"; }
[ "$(losses_of h5/metrics.jsonl)" = "$(losses_of mm/metrics.jsonl)" ] || fail "losses differ from the HDF5 dataset's"
echo "ok: a Megatron dataset trains bit for bit like the HDF5 one"

# prep's writer, read by this test.
printf 'first document\n' >a.txt
printf 'and the second one, longer\n' >b.txt
"$MPIFORMER" prep --tokenizer gpt2 --format megatron --output out.bin a.txt b.txt >/dev/null 2>&1 || fail "prep --format megatron"
"$MPIFORMER" prep --tokenizer gpt2 --output out.h5 a.txt b.txt >/dev/null 2>&1 || fail "prep hdf5"
h5dump -d /tokens -b LE -o want.u16 out.h5 >/dev/null
python3 - out want.u16 <<'PY'
import struct, sys
idx = open(sys.argv[1] + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
version, code, seqs, docs = struct.unpack_from("<QBQQ", idx, 9)
assert (version, code) == (1, 8), (version, code)  # uint16 for GPT-2's 50257 ids
sizes = struct.unpack_from(f"<{seqs}i", idx, 34)
ptrs = struct.unpack_from(f"<{seqs}q", idx, 34 + 4 * seqs)
doc_idx = struct.unpack_from(f"<{docs}q", idx, 34 + 12 * seqs)
assert len(idx) == 34 + 12 * seqs + 8 * docs
assert seqs == 2 and list(doc_idx) == [0, 1, 2], (seqs, doc_idx)
assert ptrs == (0, 2 * sizes[0]), ptrs
data = open(sys.argv[1] + ".bin", "rb").read()
tokens = struct.unpack(f"<{len(data) // 2}H", data)
want = open(sys.argv[2], "rb").read()
assert tokens == struct.unpack(f"<{len(want) // 2}H", want), "tokens differ from the HDF5 prep's"
assert tokens[0] == 50256 and tokens[sizes[0]] == 50256, "each document starts with <|endoftext|>"
print(f"prep --format megatron: {seqs} documents, {len(tokens)} tokens, as the HDF5 prep's")
PY

# Damage: each refused with the file and the field.
damage() {  # want python-expression-on-bytes
  local want=$1 expr=$2
  cp mine.bin bad.bin
  python3 -c "import struct,sys; b=bytearray(open('mine.idx','rb').read()); $expr; open('bad.idx','wb').write(b)"
  rc=0
  "$MPIFORMER" inspect bad.bin >/dev/null 2>err.txt || rc=$?
  [ "$rc" -eq 2 ] && grep -qF "$want" err.txt || { cat err.txt; fail "'$want' not reported (exit $rc)"; }
  echo "ok: $want"
}
damage "bad.idx: header: no MMIDIDX magic" "b[0:1]=b'X'"
damage "bad.idx: version: expected 1, got 2" "b[9]=2"
damage "bad.idx: dtype code: 6: token ids must be" "b[17]=6"
damage "bad.idx: sequence and document counts: say 5 sequences" "b[18]=5"
damage "bad.idx: sequence 2: starts at byte 7" "struct.pack_into('<q', b, 34+16+16, 7)"
damage "bad.idx: document index 2: 0 is out of order" "struct.pack_into('<q', b, 34+48+16, 0)"
damage "bad.idx: header: truncated" "del b[20:]"
cp mine.idx bad.idx && head -c 1000 mine.bin >bad.bin
rc=0
"$MPIFORMER" inspect bad.bin >/dev/null 2>err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -qF "bad.bin: size: 1000 bytes, the index describes" err.txt || { cat err.txt; fail "a truncated .bin was not refused"; }
echo "ok: a truncated .bin is refused"
