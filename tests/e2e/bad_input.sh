#!/usr/bin/env bash
# Each class of bad input gives its message and a non-zero exit, on one rank
# and on two (where every rank must exit: mpirun returns non-zero and
# nothing hangs), and leaves existing files untouched.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"

# expect NP "message part" ARGS...: the run fails, with that text on stderr.
expect() {
  local np=$1 want=$2
  shift 2
  local rc=0
  timeout 120 mpirun -np "$np" "$MPIFORMER" "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" -ne 0 ] || fail "exit 0 for: $*"
  [ "$rc" -ne 124 ] || fail "hung (timeout) for: $*"
  grep -qF -- "$want" err.txt || { cat err.txt >&2; fail "no '$want' in the error for: $*"; }
  if [ "$np" -gt 1 ]; then
    [ "$(grep -c 'mpiformer: error' err.txt)" -eq 1 ] || fail "the message should be printed once"
  fi
  echo "ok ($np rank(s)): $want"
}

# Each deck check at one rank count, taking the counts in turn (the check
# is the same code at any count; what the count changes, that every rank
# exits and the message is printed once, each count still shows).
NPS=(1 2)
turn=0
rr() {  # rr "message part" ARGS...: expect at the next rank count of NPS
  local np=${NPS[$((turn % ${#NPS[@]}))]}
  turn=$((turn + 1))
  expect "$np" "$@"
}
rr "missing.toml: cannot open the input deck" train missing.toml
printf '[model]\nn_layer = 2\nbogus = 1\n' >unknown.toml
rr "unknown.toml: [model] bogus: unknown key" train unknown.toml
rr "[train] micro_batch: expected an integer" train "$DECK" --set train.micro_batch=1.5
rr "[train] lr: expected a value in" train "$DECK" --set train.lr=-1
rr "[train] global_batch: must be a multiple" train "$DECK" --set train.micro_batch=5
rr "nothing.h5: no such file" train "$DECK" --set data.train=nothing.h5
rr "tiny.toml: [data] train: missing" train "$DECK" --set 'data.train=""'
# Layouts that do not fit, at rank counts 1, 2 and 4 in turn: each fails
# fast, once, everywhere.
NPS=(1 2 4)
turn=0
rr "[parallel] pp: must not exceed [model] n_layer (4), got 8" train "$DECK" --set parallel.pp=8
rr "[train] global_batch: must be a multiple of [parallel] dp x [train] micro_batch = 2 x 12" \
  train "$DECK" --set parallel.dp=2 --set train.micro_batch=12
rr "[parallel] schedule: expected \"1f1b\", \"gpipe\", \"zb-h1\" or \"interleaved\"" train "$DECK" \
  --set parallel.schedule=zigzag
rr "[parallel] zero: expected a value in [0, 3], got 4" train "$DECK" --set parallel.zero=4
rr "[parallel] zero: expected an integer" train "$DECK" --set parallel.zero=1.5
rr "[train] recompute: expected \"none\", \"attention\" or \"full\"" train "$DECK" \
  --set train.recompute=blocks
# Tensor parallelism: whole heads per tensor rank, and the rank count.
rr "[parallel] tp: must divide [model] n_head (4) so each tensor rank keeps whole attention heads, got 3" \
  train "$DECK" --set parallel.tp=3
rr "[parallel] tp: expected a value in [1, " train "$DECK" --set parallel.tp=0
rr "[parallel] tp: expected an integer" train "$DECK" --set parallel.tp=1.5
rr "[parallel] sequence_parallel: needs [parallel] tp > 1" train "$DECK" \
  --set parallel.sequence_parallel=true
rr "[parallel] sequence_parallel: needs [model] seq_len (66) to be a multiple of [parallel] tp (4)" \
  train "$DECK" --set parallel.sequence_parallel=true --set parallel.tp=4 --set model.seq_len=66
rr "[parallel] sequence_parallel: expected true or false" train "$DECK" \
  --set parallel.sequence_parallel=2
rr "[parallel] schedule, [train] recompute: schedule \"zb-h1\" defers each micro-batch's weight gradients" \
  train "$DECK" --set parallel.schedule=zb-h1 --set train.recompute=full
# Interleaving: its key without its schedule, too few chunks, chunks of
# unequal layers, micro-batches not in whole rounds of pp.
rr "[parallel] virtual_stages: 2 chunks per rank need schedule \"interleaved\"" train "$DECK" \
  --set parallel.pp=2 --set parallel.virtual_stages=2
rr "[parallel] virtual_stages: expected a value in [1, " train "$DECK" \
  --set parallel.schedule=interleaved --set parallel.virtual_stages=0
rr "[parallel] schedule, [parallel] virtual_stages: schedule \"interleaved\" needs virtual_stages >= 2" \
  train "$DECK" --set parallel.pp=2 --set parallel.schedule=interleaved
rr "[parallel] virtual_stages, [parallel] pp, [model] n_layer: schedule \"interleaved\" cuts the 4 layers into pp x virtual_stages = 2 x 4 = 8 chunks, each as long as the longest but the first and last, which give up the excess: fewer layers than chunks" \
  train "$DECK" --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=4
# 9 layers in 8 chunks: chunks of 2, the first and last giving up 7 (at
# one rank, so that the later cases keep their turns of NPS).
expect 1 "[parallel] virtual_stages, [parallel] pp, [model] n_layer: schedule \"interleaved\" cuts the 9 layers into pp x virtual_stages = 2 x 4 = 8 chunks, each as long as the longest but the first and last, which give up the excess: the first and last chunks would be left without a layer" \
  train "$DECK" --set model.n_layer=9 --set parallel.pp=2 --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=4
rr "[parallel] schedule, [train] global_batch, [parallel] pp: schedule \"interleaved\" runs micro-batches in rounds of pp = 2: global_batch / (dp x micro_batch) = 3 micro-batches" \
  train "$DECK" --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 \
  --set train.global_batch=48
for np in 1 2 4; do
  expect $np "[parallel] dp x pp x tp: 1 x 1 x 8 = 8 ranks, but the job has $np" train "$DECK" \
    --set model.n_head=8 --set parallel.tp=8
done
# Decks that cannot fit in this machine's memory: refused before anything
# is allocated (no bad_alloc), naming the keys and the bytes, on every rank.
fit="[model], [train] micro_batch, [parallel] pp, [parallel] tp, [parallel] zero: stage 0 needs about"
for np in 1 2; do
  expect $np "$fit" train "$DECK" --set parallel.dp=$np \
    --set model.n_layer=64 --set model.n_head=64 --set model.n_embd=8192
done
expect 1 "$fit" train "$DECK" --set model.vocab_size=16000000
expect 2 "at micro_batch 1000000" train "$DECK" --set parallel.pp=2 \
  --set train.micro_batch=1000000 --set train.global_batch=1000000
grep -q "To fit: raise \[parallel\] zero (now 0; .* set \[train\] recompute = \"full\", raise \[parallel\] pp (now 2) or tp" err.txt || { cat err.txt >&2; fail "no advice in the refusal"; }

# The GPU back end asked of a build or a node without one: named, on every rank.
if ! "$MPIFORMER" --version 2>/dev/null | has cuda; then
  expect 1 "[run] device: \"cuda\", but this mpiformer was built without CUDA" train "$DECK" \
    --set run.device=cuda
fi
# Loss scaling that cannot work: refused, naming the key, on every rank.
NPS=(1 2)
turn=0
rr "[train] loss_scale: expected \"dynamic\" or a fixed scale in [2^-8, 2^24]" train "$DECK" \
  --set train.precision=fp16 --set train.loss_scale=0
rr "[train] loss_scale_window: expected a value in" train "$DECK" \
  --set train.precision=fp16 --set train.loss_scale_window=-100
rr "[train] loss_scale: applies to [train] precision = \"fp16\" only" train "$DECK" \
  --set train.loss_scale=1024
expect 2 "[parallel] dp x pp x tp: 1 x 1 x 1 = 1 ranks, but the job has 2" train "$DECK"
expect 4 "[parallel] dp x pp x tp: 2 x 1 x 1 = 2 ranks, but the job has 4" train "$DECK" --set parallel.dp=2
expect 1 "[parallel] dp x pp x tp: 2 x 2 x 1 = 4 ranks, but the job has 1" train "$DECK" \
  --set parallel.dp=2 --set parallel.pp=2

# A checkpoint directory that cannot be written is found at the start, not
# at the first save after hours of training (as root, permissions cannot
# stop a write, so a file stands where a directory should be).
touch not_a_dir
expect 2 "not_a_dir/ckpt: [checkpoint] dir: cannot create the directory" train "$DECK" \
  --set parallel.dp=2 --set checkpoint.dir=not_a_dir/ckpt
expect 1 "not_a_dir/run: [run] dir: cannot create the directory" train "$DECK" \
  --set run.dir=not_a_dir/run
expect 2 "not_a_dir/run: [run] dir: cannot create the directory" train "$DECK" \
  --set parallel.dp=2 --set run.dir=not_a_dir/run

# An input only one rank cannot read (a file missing on one node): no hang,
# the message once, every rank non-zero.
cat >one_rank.sh <<SH
#!/usr/bin/env bash
extra=()
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && extra=(--set data.train=/nonexistent/only-on-rank-1.h5)
exec "$MPIFORMER" train "$DECK" --set parallel.dp=2 "\${extra[@]}"
SH
chmod +x one_rank.sh
rc=0
timeout 120 mpirun -np 2 ./one_rank.sh >out.txt 2>err.txt || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "rank-local input error: exit $rc"
grep -qF "only-on-rank-1.h5: no such file (nothing matches this path) (on rank 1)" err.txt ||
  { cat err.txt >&2; fail "rank-local input error not reported"; }
[ "$(grep -c 'mpiformer: error' err.txt)" -eq 1 ] || fail "rank-local error printed more than once"
echo "ok (2 rank(s)): an input error on one rank only"

# A deck that differs between ranks: each rank starts in its own working
# directory holding its own deck.toml (n_layer 2 on rank 0, 3 on rank 1).
# Rank 0's deck, and its directory for relative paths, are every rank's.
mkdir -p wd0 wd1
ln -s ../data wd0/data
sed 's/^n_layer = .*/n_layer = 2/' "$DECK" >wd0/deck.toml
sed 's/^n_layer = .*/n_layer = 3/; s/^lr = .*/lr = 1.0/' "$DECK" >wd1/deck.toml
one=(train deck.toml --set parallel.pp=2 --set train.steps=2 --set train.eval_every=0)
rc=0
timeout 120 mpirun -np 1 -wdir "$WORK/wd0" "$MPIFORMER" "${one[@]}" :   -np 1 -wdir "$WORK/wd1" "$MPIFORMER" "${one[@]}" >out.txt 2>err.txt || rc=$?
[ "$rc" -eq 0 ] || { cat out.txt err.txt >&2; fail "decks differing between ranks: exit $rc"; }
grep -q "parameters, 2 layers" out.txt || { cat out.txt >&2; fail "not rank 0's deck"; }
[ -e wd0/runs/tiny/checkpoints/step_00000002.h5 ] && [ ! -e wd1/runs ] ||
  fail "relative paths did not mean rank 0's"
echo "ok (2 rank(s)): rank 0's deck and working directory are every rank's"

# Decks that are not decks: refused at once, before parsing.
head -c 2000000 /dev/urandom >garbage.toml
expect 2 "garbage.toml: 2000000 bytes: an input deck is" train garbage.toml
mkfifo fifo.toml
expect 2 "fifo.toml: not a regular file" train fifo.toml

# Damaged datasets.
printf 'just text' >plain.txt
expect 1 "plain.txt: not a token dataset" train "$DECK" --set data.train=plain.txt
python3 - <<'PY'
import struct
def shard(name, tokens, magic=20240520, count=None, cut=0):
    head = struct.pack("<256i", magic, 1, len(tokens) if count is None else count, *([0] * 253))
    body = struct.pack("<%dH" % len(tokens), *tokens)
    open(name, "wb").write((head + body)[: len(head + body) - cut])
shard("magic.bin", [1] * 100, magic=7)
shard("trunc.bin", [1] * 100, cut=10)
shard("range.bin", [1] * 50 + [60000] + [1] * 49)
shard("short.bin", [1] * 20)
PY
expect 1 "magic.bin: header magic: expected 20240520" train "$DECK" --set data.train=magic.bin
expect 1 "trunc.bin: header token count" train "$DECK" --set data.train=trunc.bin
expect 1 "range.bin: token 50: id 60000 is not below" train "$DECK" --set data.train=range.bin \
  --set 'data.val=""'
expect 1 "range.bin: token 50: id 60000 is not below" inspect range.bin
# A FIFO named like a dataset would block the open forever.
mkfifo fifo.bin
expect 2 "fifo.bin: not a regular file" train "$DECK" --set data.train=fifo.bin --set parallel.dp=2
expect 1 "the data's vocabulary (50257) exceeds [model] vocab_size (256)" train "$DECK" \
  --set data.train=short.bin --set model.vocab_size=256
expect 1 "short.bin: [data] train: 20 tokens: too few" train "$DECK" --set data.train=short.bin

# prep: bad text for gpt2 must not touch an existing output file.
cp data/tinyshakespeare_byte.h5 keep.h5
sum_before=$(md5sum keep.h5)
printf 'ok \xff\xfe bad' >bad_utf8.txt
expect 1 "bad_utf8.txt: byte 3: text is not valid UTF-8" prep --tokenizer gpt2 --output keep.h5 bad_utf8.txt
[ "$sum_before" = "$(md5sum keep.h5)" ] || fail "a failed prep changed the existing output"
expect 1 "--tokenizer" prep --tokenizer nope --output x.h5 plain.txt
expect 1 "--tokens" inspect data/tinyshakespeare_byte.h5 --tokens -1
# A flag's refusal names the flag and what was given.
M="$SOURCE_DIR/inputs/machines/h200-single.toml"
expect 1 "--ranks: expected a whole number, got abc" plan "$DECK" --machine "$M" --ranks abc
expect 1 "--memory-margin: expected a number in [0, 0.9], got 1.5" \
  plan "$DECK" --machine "$M" --ranks 1 --memory-margin 1.5
# prep never overwrites its own input, as the output or as the validation split.
cp plain.txt own.txt
expect 1 "own.txt: is both an input and --output" prep --output own.txt own.txt
cp plain.txt own_val.txt
expect 1 "own_val.txt: is both an input and the validation split" \
  prep --val-fraction 0.1 --output own.txt own_val.txt
cp plain.txt own.txt.rank0.tokens.tmp
expect 1 "own.txt.rank0.tokens.tmp: is both an input and a rank's scratch file" \
  prep --output own.txt own.txt.rank0.tokens.tmp
[ "$(cat own.txt)" = "just text" ] && [ "$(cat own_val.txt)" = "just text" ] &&
  [ "$(cat own.txt.rank0.tokens.tmp)" = "just text" ] || fail "prep changed its own input"
# A device (an endless input) is refused before it is opened, as a FIFO is.
expect 1 "/dev/zero: not a regular file" prep --output z.h5 /dev/zero
expect 1 "--val-fraction: expected a number in [0, 0.5], got nan" \
  prep --val-fraction nan --output x.h5 plain.txt
# Help is ours alone: Kokkos never sees the program's arguments.
for args in "--help" "train --help"; do
  # shellcheck disable=SC2086
  "$MPIFORMER" $args >help.txt 2>&1 || fail "$args: non-zero exit"
  grep -q "^Usage:" help.txt || { cat help.txt >&2; fail "$args: no usage"; }
  ! grep -qi kokkos help.txt || { cat help.txt >&2; fail "$args: Kokkos' help printed"; }
  [ "$(wc -l <help.txt)" -lt 40 ] || fail "$args: $(wc -l <help.txt) lines of help"
done
echo "ok: --help and train --help print ours only"
echo "all bad inputs rejected"
