#!/usr/bin/env bash
# Seeded fuzzing of the file kinds mpiformer reads: an HDF5 token dataset,
# an llm.c shard, a Megatron .bin/.idx pair (either file damaged) and a
# checkpoint. Each case is a small valid file
# with bytes flipped (anywhere, or in the first or last 4 KiB where HDF5
# keeps most of its metadata), a block zeroed, the file cut short or grown.
# `inspect` reads every byte a run would (headers, every token, every
# tensor with its checksum) and must answer every case with exit 0 or 2,
# never a signal (nor, in the debug preset, a sanitizer report), and name
# each file it refuses. FUZZ_CASES (per kind) and FUZZ_SEED vary it.
source "$(dirname "$0")/lib.sh"
cases=${FUZZ_CASES:-100}
seed=${FUZZ_SEED:-2026}
head -c 20000 "$SOURCE_DIR/inputs/tinyshakespeare.txt" >small.txt
"$MPIFORMER" prep --tokenizer byte --output dataset.h5 small.txt >/dev/null
python3 - <<'PY'
import struct
tokens = [(i * 7919) % 50257 for i in range(2000)]
open("shard.bin", "wb").write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) +
                              struct.pack("<%dH" % len(tokens), *tokens))
PY
cat >small.toml <<'TOML'
[model]
n_layer = 1
n_head = 2
n_embd = 16
seq_len = 16
[data]
train = "dataset.h5"
[train]
steps = 1
global_batch = 2
micro_batch = 2
lr = 1e-3
[run]
dir = "run"
TOML
"$MPIFORMER" train small.toml >train.log 2>&1 || { cat train.log; fail "could not make the checkpoint"; }
cp run/checkpoints/step_00000001.h5 checkpoint.h5
"$MPIFORMER" prep --tokenizer byte --format megatron --output megatron.bin small.txt >/dev/null
"$MPIFORMER" inspect dataset.h5 shard.bin checkpoint.h5 megatron.idx >/dev/null || fail "the valid files do not inspect"

mkdir -p cases
python3 - "$cases" "$seed" <<'PY'
import os, random, sys
cases, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
for src in ("dataset.h5", "shard.bin", "checkpoint.h5", "megatron.idx", "megatron.bin"):
    data = open(src, "rb").read()
    stem, ext = os.path.splitext(src)
    for i in range(cases // 2 if stem == "megatron" else cases):
        b = bytearray(data)
        kind = rng.choice(["flip", "flip_head", "flip_tail", "zero", "cut", "grow"])
        if kind.startswith("flip"):
            lo, hi = {"flip": (0, len(b)), "flip_head": (0, min(4096, len(b))),
                      "flip_tail": (max(0, len(b) - 4096), len(b))}[kind]
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        elif kind == "zero":
            at = rng.randrange(len(b))
            b[at:at + 64] = bytes(len(b[at:at + 64]))
        elif kind == "cut":
            del b[rng.randrange(len(b)):]
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 5000)))
        name = "cases/%s%s_%03d_%s" % (stem, ext.replace(".", "_"), i, kind)
        if stem == "megatron":
            # A pair with one file damaged: the other as it was.
            other = ".bin" if ext == ".idx" else ".idx"
            open(name + other, "wb").write(open(stem + other, "rb").read())
            open(name + ext, "wb").write(b)
        else:
            open(name + ext, "wb").write(b)
PY

# Batches of 50 files per process; a signal names its batch, then its file.
ls cases/* | grep -v "^cases/megatron.*\.bin$" >all.txt  # a pair is named by its .idx
split -l 50 all.txt batch.
crashed=0
sanitizer="ERROR: AddressSanitizer\|runtime error:"
for batch in batch.*; do
  rc=0
  xargs -a "$batch" "$MPIFORMER" inspect --tokens 4 >"$batch.out" 2>"$batch.err" || rc=$?
  # xargs says 123 when the command exited 1-125, 125 when it was killed.
  if { [ "$rc" -ne 0 ] && [ "$rc" -ne 123 ]; } || grep -q "$sanitizer" "$batch.err"; then
    while read -r f; do
      frc=0
      "$MPIFORMER" inspect --tokens 4 "$f" >/dev/null 2>one.err || frc=$?
      if { [ "$frc" -ne 0 ] && [ "$frc" -ne 2 ]; } || grep -q "$sanitizer" one.err; then
        echo "CRASH: exit $frc on $f:"
        grep -m1 -A12 "$sanitizer" one.err || tail -3 one.err
        cp "$f" "${FUZZ_KEEP:-/dev/null}" 2>/dev/null || true
        crashed=$((crashed + 1))
      fi
    done <"$batch"
  fi
done
[ "$crashed" -eq 0 ] || fail "$crashed crash(es) or sanitizer reports"

# Every refused file is named in its message; every other one was inspected.
# inspect's report of one file: from its "file:" line to the blank line.
report() { awk -v f="$1" '$1 == "file:" && $2 == f {on = 1} on && /^$/ {exit} on' batch.*.out; }
refused=0 accepted=0
while read -r f; do
  # A refusal names the file (a Megatron pair: either of its two files).
  if grep -qF "mpiformer: error: ${f%.*}." batch.*.err || report "$f" | has -E "^(DAMAGED|MISSING)"; then
    refused=$((refused + 1))
  elif [ -n "$(report "$f")" ]; then
    accepted=$((accepted + 1))
  else
    fail "$f: neither inspected nor refused by name"
  fi
done <all.txt
echo "ok: $(wc -l <all.txt) mutated files (seed $seed): $refused refused by name, $accepted read without harm, 0 crashes"
