#!/usr/bin/env bash
# mpiformer calibrate, plan and [parallel] auto on this machine:
#  - calibrate under mpirun (2 ranks) writes a machine file plan reads,
#    saying each phase as it starts (once: rank 0);
#  - plan --ranks 2 lists layouts of 2 ranks only, fastest first, each
#    fitting the machine's memory; --explain writes the predicted timeline
#    of a pp 2 GPipe layout as a Chrome trace with every forward and
#    backward of both stages;
#  - a machine too small for the model is refused with what the model
#    needs and what a rank has (exit 2); bad machine files are named with
#    their key (exit 2); calibrate on one rank is refused;
#  - train with [parallel] auto picks plan's first layout, says so, and
#    trains (a Mixture of Experts too, its plan trying ep 2); without a machine file it is refused, naming [run] machine,
#    and where nothing fits with the plan's refusal, before anything is
#    written.
# No timing is asserted (benchmarks measure those: bench/plan_accuracy.sh).
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
data=(--set data.train='"data/tinyshakespeare_byte.h5"')

run_mpi 2 calibrate "$DECK" --seconds 0.003 --name "e2e machine" -o machine.toml >cal.log 2>&1 ||
  { cat cal.log; fail "calibrate"; }
grep -q "wrote machine.toml" cal.log || fail "calibrate did not say what it wrote"
# It says what it measures as it goes (rank 0 only): each phase, in order.
for phase in "\[1/4\] whole stages" "\[2/4\] GEMM peak" "\[3/4\] kernels" "\[4/4\] links"; do
  [ "$(grep -c "^calibrate: $phase" cal.log)" = 1 ] || { cat cal.log; fail "calibrate: no '$phase' line"; }
done
grep -q "^calibrate: measured in [0-9]* s" cal.log || fail "calibrate did not say how long it took"
for section in '^\[machine\]' '^\[\[compute.matmul\]\]' '^\[\[compute.attention\]\]' \
               '^\[\[compute.kernels\]\]' '^\[\[compute.stage\]\]' '^\[intra\]'; do
  grep -q "$section" machine.toml || fail "machine.toml has no $section"
done
grep -q '^precision = "fp32"' machine.toml || fail "machine.toml does not name the precision of its rates"
grep -q '^alltoall = { latency_us = ' machine.toml || fail "machine.toml has no measured all-to-all"

"$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --ranks 2 --top 5 >plan.txt ||
  { cat plan.txt; fail "plan"; }
grep -q "layouts considered" plan.txt || fail "plan printed no summary"
grep -qE '^ +1 \| dp' plan.txt || fail "plan printed no layout"
"$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --ranks 2 --top 1000 --json >plan.json
/usr/bin/python3 - plan.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
rows = p["layouts"]
assert rows and p["considered"] >= len(rows), p["considered"]
for r in rows:
    assert r["dp"] * r["pp"] * r["tp"] * r["cp"] == 2, r
    assert 32 % (r["dp"] * r["micro_batch"]) == 0, r
    assert r["fits"] and r["memory_max"] <= r["memory_available"], r
    # (both printed to 6 significant digits)
    assert abs(r["step_s"] - 32 * 64 / r["tokens_per_s"]) < 2e-5 * r["step_s"], r
rates = [r["tokens_per_s"] for r in rows]
assert rates == sorted(rates, reverse=True), "not fastest first"
layouts = {(r["dp"], r["pp"], r["tp"], r["cp"]) for r in rows}
assert layouts == {(2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)}, layouts
print(f"plan: {len(rows)} layouts of 2 ranks, fastest first")
PY
# Interleaving whose chunks are not all alike says how the layers fall.
"$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --as-given --set model.n_layer=6 \
  --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 \
  >uneven.txt || { cat uneven.txt; fail "plan of 6 layers on 2 x 2 chunks"; }
grep -q "chunks of #1: 6 layers into 2 x 2 chunks of 2, the model's first (the embedding's) 1 and its last (the head's) 1" \
  uneven.txt || { cat uneven.txt; fail "plan did not say how 6 layers fall into 2 x 2 chunks"; }

# zero 3 says what it keeps whole beside its shard: the tiny deck's
# vocabulary (256 x 128) fits a block's window and goes through them; at
# 4096 x 128 (2.6 blocks of 12 x 128 x 128 + 13 x 128) it goes through
# them in 3 pieces.
for v in 256 4096; do
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --as-given --set parallel.dp=2 \
    --set parallel.zero=3 --set model.vocab_size=$v --explain zero3_$v.json >zero3_$v.txt ||
    { cat zero3_$v.txt; fail "plan at zero 3, vocabulary $v"; }
done
grep -q "zero 3 keeps whole beside its shard: .*the vocabulary goes through the windows" zero3_256.txt ||
  { cat zero3_256.txt; fail "plan at zero 3 did not say the vocabulary goes through the windows"; }
said="the vocabulary goes through the windows, as a block does, in up to 3 pieces of a window each"
grep -q "zero 3 keeps whole beside its shard: .*$said" zero3_4096.txt ||
  { cat zero3_4096.txt; fail "plan at zero 3 did not say the vocabulary goes in pieces"; }

"$MPIFORMER" plan "$DECK" "${data[@]}" --set parallel.pp=2 --set parallel.schedule=gpipe \
  --set train.micro_batch=8 --machine machine.toml --as-given --explain timeline.json >as_given.txt
grep -q "compute of the busiest stage by kernel" as_given.txt || fail "no per-kernel split"
/usr/bin/python3 - timeline.json <<'PY'
import json, sys, collections
ev = json.load(open(sys.argv[1]))
spans = collections.Counter((e["pid"], e["name"]) for e in ev if e.get("ph") == "X")
for stage in (0, 1):
    # 4 micro-batches of 8 (global 32, dp 1): every forward and backward.
    assert spans[(stage, "forward")] == 4 and spans[(stage, "backward")] == 4, spans
print("timeline: both stages' 4 forwards and 4 backwards")
PY
# A search keeps no timelines (each is every action of every stage): the
# first layout's is priced again for --explain, the one the table shows.
"$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --ranks 2 --top 1 --explain searched.json >searched.txt
/usr/bin/python3 - searched.json searched.txt <<'PY'
import json, sys, collections, re
ev = json.load(open(sys.argv[1]))
first = re.search(r"^ +1 \| dp (\d+) pp (\d+) tp \d+ mb (\d+)", open(sys.argv[2]).read(), re.M)
assert first, "no first layout"
dp, pp, mb = map(int, first.groups())
spans = collections.Counter((e["pid"], e["name"]) for e in ev if e.get("ph") == "X")
for stage in range(pp):
    assert spans[(stage, "forward")] == 32 // (dp * mb), (spans, dp, pp, mb)
print(f"searched timeline: {pp} stage(s), {32 // (dp * mb)} forwards each")
PY

# A machine too small for the model: refused with the need and the supply.
# (Its libraries' bytes set to none: a runtime_mb as large as the memory is
# refused by name, checked below.)
sed -e 's/^memory_gib = .*/memory_gib = 0.001/' -e 's/^runtime_mb = .*/runtime_mb = 0/' machine.toml >small.toml
rc=0
"$MPIFORMER" plan "$DECK" "${data[@]}" --machine small.toml --ranks 2 >small.txt 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "a machine too small: exit $rc"
grep -qE "needs at least [0-9.]+ GiB per rank .* gives 0.00 GiB per rank" small.txt ||
  { cat small.txt; fail "the refusal does not say what is needed"; }

expect_refusal() {  # message file args...
  local want=$1
  shift
  rc=0
  "$@" >bad.txt 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat bad.txt; fail "exit $rc for: $*"; }
  grep -qF -- "$want" bad.txt || { cat bad.txt; fail "no '$want' for: $*"; }
}
sed 's/^memory_gib/memory_gb/' machine.toml >typo.toml
expect_refusal "typo.toml: [machine] memory_gb: unknown key" \
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine typo.toml --ranks 2
sed 's/^memory_gib = .*/memory_gib = 0.001/' machine.toml >crowded.toml
expect_refusal "crowded.toml: [machine] runtime_mb:" \
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine crowded.toml --ranks 2
grep -q "as much as a device's whole memory" bad.txt || { cat bad.txt; fail "runtime_mb over the memory not named as such"; }
expect_refusal "gone.toml: cannot open the machine file" \
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine gone.toml --ranks 2
expect_refusal "the links between ranks" run_mpi 1 calibrate "$DECK" --seconds 0.003 -o one.toml
[ ! -e one.toml ] || fail "a refused calibrate wrote its file"
# Outputs in a folder that is not there: exit 2 before any work.
expect_refusal "nodir/timeline.json: --explain: its folder nodir does not exist" \
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine machine.toml --ranks 2 --explain nodir/timeline.json
expect_refusal "nodir/machine.toml: calibrate --output: its folder nodir does not exist" \
  run_mpi 2 calibrate "$DECK" --seconds 0.003 -o nodir/machine.toml

# Host bf16 rates (oneDNN's products): they plan a bf16 deck, and a deck
# of another precision is refused by the key, not priced at them.
run_mpi 2 calibrate "$DECK" --precision bf16 --seconds 0.003 -o bf16.toml >cal_bf16.log 2>&1 ||
  { cat cal_bf16.log; fail "calibrate --precision bf16"; }
grep -q '^precision = "bf16"' bf16.toml || fail "bf16.toml does not name the precision of its rates"
"$MPIFORMER" plan "$DECK" "${data[@]}" --set train.precision='"bf16"' --machine bf16.toml \
  --ranks 2 --top 1 >plan_bf16.txt || { cat plan_bf16.txt; fail "plan a bf16 deck with bf16 rates"; }
grep -qE '^ +1 \| dp' plan_bf16.txt || fail "plan printed no bf16 layout"
expect_refusal "bf16.toml: [compute] precision: its rates are bf16's, but the deck trains in fp32" \
  "$MPIFORMER" plan "$DECK" "${data[@]}" --machine bf16.toml --ranks 2

# [parallel] auto: the plan's first layout, said and used.
first_layout() {  # plan.json: its first layout as the log names it
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["layouts"][0]
s = "dp {dp} pp {pp} tp {tp} mb {micro_batch} zero {zero} {recompute} {schedule}".format(**r)
s += f" v{r['virtual_stages']}" if r["virtual_stages"] > 1 else ""
s += " sp" if r["sequence_parallel"] else ""
s += f" ep {r['ep']}" if r["ep"] > 1 else ""
s += f" cp {r['cp']}" if r["cp"] > 1 else ""
print(s)
PY
}
want=$(first_layout plan.json)
run_mpi 2 train "$DECK" "${data[@]}" --set parallel.auto=true --set run.machine='"machine.toml"' \
  --set train.steps=3 --set train.eval_every=0 --set run.dir=auto >auto.log 2>&1 ||
  { tail -20 auto.log; fail "train with [parallel] auto"; }
grep -qF "auto:  $want, the fastest of" auto.log || { grep "^auto" auto.log; fail "auto did not pick '$want'"; }
set -- $want
grep -q "^grid:  dp $2 x pp $4 x tp $6" auto.log || fail "the grid is not the chosen layout"
grep -q "^step 3/3" auto.log || fail "the auto run did not train"
# Its memory as planned: the accounting and the machine's runtime bytes
# (calibrate's probes) against the run's own peak growth, the busiest
# rank of each, within 20% (bench/plan_accuracy.sh's rows: -13% to +2%).
# A save's buffers counted by both once made it +38% to +84%.
/usr/bin/python3 - plan.json auto/metrics.jsonl <<'PY' || fail "the plan's memory is not the run's"
import json, sys
planned = json.load(open(sys.argv[1]))["layouts"][0]["memory_max"]
rows = [json.loads(l) for l in open(sys.argv[2]) if '"memory_measured"' in l]
measured = max(r["peak_growth"] for r in rows[-1]["memory_measured"])
err = planned / measured - 1
print(f"memory: planned {planned / 1e6:.1f} MB, measured {measured / 1e6:.1f} MB ({err:+.1%})")
assert abs(err) <= 0.2, err
PY
# A Mixture of Experts: the plan also tries ep 2 (the stage's 2 replicas,
# data or context ranks, share out the 8 experts) and cp 2, and auto trains
# whatever comes first, ep and cp included.
MOE="$SOURCE_DIR/inputs/llama-moe-tiny.toml"
"$MPIFORMER" plan "$MOE" "${data[@]}" --machine machine.toml --ranks 2 --top 1000 --json >plan_moe.json
/usr/bin/python3 - plan_moe.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["layouts"]
eps = {r["ep"] for r in rows}
assert eps == {1, 2}, eps
assert all(r["ep"] == 1 or (r["dp"] * r["cp"] == 2 and r["ep_comm_s"] > 0) for r in rows), rows
assert {r["cp"] for r in rows if r["ep"] == 2} == {1, 2}, "ep over context ranks not tried"
PY
want=$(first_layout plan_moe.json)
run_mpi 2 train "$MOE" "${data[@]}" --set parallel.auto=true --set run.machine='"machine.toml"' \
  --set train.steps=2 --set train.eval_every=0 --set run.dir=auto_moe >auto_moe.log 2>&1 ||
  { tail -20 auto_moe.log; fail "train a Mixture of Experts with [parallel] auto"; }
grep -qF "auto:  $want, the fastest of" auto_moe.log ||
  { grep "^auto" auto_moe.log; fail "auto did not pick '$want' for the Mixture of Experts"; }
grep "^auto:" auto_moe.log
grep -q "^step 2/2" auto_moe.log || fail "the auto run of the Mixture of Experts did not train"
# A deck micro-batch the plan does not keep (1 here: larger ones are faster
# to the planner): the data are batched as the chosen layout says (they
# were sized from the deck's once, and the first step read past them).
run_mpi 2 train "$DECK" "${data[@]}" --set parallel.auto=true --set run.machine='"machine.toml"' \
  --set train.micro_batch=1 --set train.steps=2 --set train.eval_every=0 --set run.dir=auto_mb >auto_mb.log 2>&1 ||
  { tail -20 auto_mb.log; fail "train with [parallel] auto from a deck with micro_batch 1"; }
grep "^auto:" auto_mb.log
grep -q "^step 2/2" auto_mb.log || fail "the auto run from micro_batch 1 did not train"
expect_refusal "[run] machine" run_mpi 2 train "$DECK" "${data[@]}" --set parallel.auto=true \
  --set train.steps=1 --set run.dir=noauto
expect_refusal "[parallel] auto: no layout of 2 ranks fits" run_mpi 2 train "$DECK" "${data[@]}" \
  --set parallel.auto=true --set run.machine='"small.toml"' --set train.steps=1 --set run.dir=small
[ ! -e small ] || fail "a refused auto run made its run directory"
echo "plan: calibrate, plan, refusals and [parallel] auto as expected"
