#!/usr/bin/env bash
# A weighted blend of two sources. (1) The run draws each source's share:
# the checkpoint's counts after 6 steps are within one sample of 0.7 and 0.3
# of the samples (computed here from the weights alone), and each source's
# validation loss is in metrics.jsonl. (2) Resume under another layout: 3
# steps at dp 2, then 3 at dp 1 x pp 2, match 6 straight steps at dp 2 to the
# layout tolerance (1e-5 relative, layout_equivalence.sh) and the data
# position goes on. (3) A changed weight is refused (exit 2 on every rank,
# naming the source and both weights, no checkpoint written), and accepted
# with [data] reblend, which the log states. (4) Bad blends: one message
# naming the deck or file and the field, exit non-zero on every rank.
source "$(dirname "$0")/lib.sh"
text="$SOURCE_DIR/inputs/tinyshakespeare.txt"
head -c 600000 "$text" >a.txt
tail -c +600001 "$text" >b.txt
for s in a b; do
  "$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 --output "$s.h5" "$s.txt" >/dev/null
done
cat >blend.toml <<'TOML'
[model]
n_layer = 2
n_head = 2
n_embd = 64
seq_len = 64
[[data.source]]
path = "a.h5"
weight = 0.7
val = "a_val.h5"
[[data.source]]
name = "bee"
path = "b.h5"
weight = 0.3
val = "b_val.h5"
[train]
steps = 6
global_batch = 16
micro_batch = 4
lr = 3e-3
log_every = 1
eval_every = 3
eval_batches = 1
[run]
dir = "run"
TOML
train() {  # NP DIR ARGS...
  local np=$1 dir=$2
  shift 2
  run_mpi "$np" train blend.toml --set run.dir="$dir" "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "training in $dir failed"; }
}

# (1) and the reference of (2).
train 2 straight --set parallel.dp=2
h5dump -a /data_blend straight/checkpoints/step_00000006.h5 >blend.txt
python3 - <<'PY'
import json, re
text = open("blend.txt").read()
counts = {m[0]: int(m[1]) for m in re.findall(r"source\s+(\S+)\s+\S+\s+\d+\s+\S+\s+\d+\s+(\d+)", text)}
assert set(counts) == {"a", "bee"}, counts
n = 6 * 16
for name, w in (("a", 0.7), ("bee", 0.3)):
    assert abs(counts[name] - w * n) < 1, f"{name}: {counts[name]} samples of {n}, share {w}"
assert sum(counts.values()) == n
evals = [j for j in map(json.loads, open("straight/metrics.jsonl")) if "val_loss" in j]
assert len(evals) == 2 and all("val_loss/a" in j and "val_loss/bee" in j for j in evals), evals
blended = 0.7 * evals[-1]["val_loss/a"] + 0.3 * evals[-1]["val_loss/bee"]
assert abs(blended - evals[-1]["val_loss"]) < 1e-6 * blended, evals[-1]
print(f"shares: {counts} of {n} samples; per-source validation losses logged")
PY

# A small source runs out and starts again, and the log says so: 15 windows
# at 0.3 of 96 samples is about 29 draws, so its epoch 2 begins.
head -c 1000 b.txt >tiny.txt
"$MPIFORMER" prep --tokenizer byte --output tiny.h5 tiny.txt >/dev/null
sed 's/path = "b.h5"/path = "tiny.h5"/; s/name = "bee"/name = "tiny"/; /b_val.h5/d' blend.toml >tiny.toml
run_mpi 1 train tiny.toml --set run.dir=tiny >tiny.log 2>&1 || { cat tiny.log; fail "tiny source"; }
has -E '^step [0-9]+: data: source "tiny" begins epoch 2 \(its 15 windows seen 1 time so far\)' tiny.log ||
  { cat tiny.log; fail "no line for the small source's second epoch"; }
echo "a small source's new epoch is logged"

# (2) 3 steps at dp 2, the rest at dp 1 x pp 2.
train 2 split --set parallel.dp=2 --set train.stop_at=3
train 2 split --set parallel.pp=2
has "resumed from .*step_00000003.h5: step 3, 48 samples seen" split.log || fail "no resume line"
python3 - <<'PY'
import json
ref = {j["step"]: j for j in map(json.loads, open("straight/metrics.jsonl")) if "loss" in j}
got = {j["step"]: j for j in map(json.loads, open("split/metrics.jsonl")) if "loss" in j}
assert sorted(got) == list(range(1, 7)), sorted(got)
for s in range(1, 7):
    r, g = ref[s]["loss"], got[s]["loss"]
    assert abs(g - r) <= 1e-5 * abs(r), f"step {s}: loss {g} vs {r}"
    assert got[s]["samples"] == 16 * s, f"step {s}: data position {got[s]['samples']}"
print("blend resumed under dp 1 x pp 2 matches dp 2 straight (rel 1e-5)")
PY

# (3) A changed weight.
sed 's/weight = 0.7/weight = 0.6/' blend.toml >changed.toml
rc=0
run_mpi 2 train changed.toml --set run.dir=straight --set train.steps=9 --set parallel.dp=2 \
  >refused.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat refused.log; fail "a changed blend: exit $rc, expected 2"; }
has -F 'source "a": weight 0.7 in the checkpoint, 0.6 in the deck' refused.log ||
  { cat refused.log; fail "the refusal does not name the change"; }
[ "$(grep -c 'mpiformer: error' refused.log)" -eq 1 ] || fail "the refusal should be printed once"
[ ! -e straight/checkpoints/step_00000009.h5 ] || fail "a refused resume wrote a checkpoint"
run_mpi 1 train changed.toml --set run.dir=straight --set train.steps=9 --set data.reblend=true \
  >reblend.log 2>&1 || { cat reblend.log; fail "reblend failed"; }
has -F 'data: re-blended from sample 96 ([data] reblend)' reblend.log || fail "no re-blend line"
echo "a changed weight: refused, then re-blended from sample 96"

# (4) Bad blends.
expect_bad() {  # "message part" DECK-TEXT-SED [ARGS...]
  local want=$1
  sed "$2" blend.toml >bad.toml
  shift 2
  rc=0
  timeout 120 mpirun -np 2 "$MPIFORMER" train bad.toml --set run.dir=bad --set parallel.dp=2 \
    "$@" >bad.log 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat bad.log; fail "exit $rc for: $want"; }
  has -F -- "$want" bad.log || { cat bad.log; fail "no '$want'"; }
  [ "$(grep -c 'mpiformer: error' bad.log)" -eq 1 ] || fail "'$want' should be printed once"
  echo "ok: $want"
}
expect_bad "[[data.source]] 1 weight: expected a finite number > 0" 's/weight = 0.7/weight = -0.7/'
expect_bad "[[data.source]] 1 weight: expected a finite number > 0" 's/weight = 0.7/weight = 0/'
expect_bad "[[data.source]] 1 weight: expected a finite number > 0" 's/weight = 0.7/weight = nan/'
expect_bad "[[data.source]] 2 weight: expected a number" 's/weight = 0.3/weight = "lots"/'
expect_bad "[[data.source]] 2 name: \"a\" names another source too" 's/name = "bee"/name = "a"/'
expect_bad "nothing*.h5: no such file" 's/path = "a.h5"/path = "nothing*.h5"/'
expect_bad "[data] train, [[data.source]]: give one" 's/^//' --set data.train=a.h5
: >empty.txt
"$MPIFORMER" prep --tokenizer byte --output empty.h5 empty.txt >/dev/null
expect_bad 'empty.h5: [[data.source]] "empty": 0 tokens' 's/path = "a.h5"/path = "empty.h5"/'
"$MPIFORMER" prep --tokenizer gpt2 --output gpt2.h5 b.txt >/dev/null
expect_bad 'gpt2.h5: [[data.source]] "bee" tokenizer: "gpt2" differs' 's/path = "b.h5"/path = "gpt2.h5"/'
