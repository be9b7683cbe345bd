# Shared by the end-to-end tests: a scratch directory, the sample data, and
# a launcher that works as root and on few cores. Sourced, not run.
set -euo pipefail
: "${MPIFORMER:?path to the mpiformer binary}"
: "${SOURCE_DIR:?path to the source tree}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# After a rank exits non-zero, mpirun waits odls_base_sigkill_timeout (1 s,
# about 2 s as measured) before it kills the rest, even with one rank: most of
# the time of a test made of refusals (bad_input.sh: 132 s, 41 s without).
# No test needs that grace: signals for a checkpoint go to the ranks
# themselves (as Slurm sends them) or through jobs/local.sh as SIGUSR1.
# recovery.sh, which checks how a real launch tears down, restores it.
export OMPI_MCA_odls_base_sigkill_timeout=0
# Open MPI tries UCX before its own shared-memory transport: absent or not
# usable here, the probe costs about 0.25 s of each of the suite's ~600
# launches; on one node ob1 (shared memory) is the transport either way.
# A rank started without mpirun (a tool run by hand, a one-rank train)
# needs no daemon: Open MPI would start one (0.2 s).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_ess_singleton_isolated=1
# A rank waiting in MPI yields its core. mpirun turns this on itself only
# when one launch has more ranks than cores; ctest runs two tests at once,
# so two 2-rank launches share 2 cores, and a waiting rank that spins takes
# the core from a rank of the other test with work to do: two 2-rank pp 2
# runs of the tiny deck side by side took 3.4 s, 2.0 s with this (1.3 s
# alone).
export OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mpiformer-e2e-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# Open MPI keeps its session directories under TMPDIR, and two launches
# starting at once (ctest runs two tests at a time) can race to create and
# remove the shared top one ("mkdir: File exists"): each test has its own.
mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"

fail() { echo "FAIL: $*" >&2; exit 1; }

# A pipeline's test for a line: grep's arguments, all of the input read.
# "producer | grep -q" stops reading at the first match, and a producer that
# writes after that dies of SIGPIPE, which pipefail reports as the pipeline
# failing: a flaky "not found" (seen with tar -t's listing).
has() { grep "$@" >/dev/null; }

# This test's mpiformer processes (their working directory is its $WORK):
# never another test's, which ctest may be running at the same time.
ranks_here() {
  local here p
  here=$(readlink -f "$WORK")
  for p in $(pgrep -x mpiformer); do
    [ "$(readlink -f "/proc/$p/cwd" 2>/dev/null)" = "$here" ] && echo "$p"
  done
  return 0
}

# Byte-level Tiny Shakespeare with a 10% validation split, in $WORK/data.
prep_sample_data() {
  mkdir -p data
  "$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 \
    --output data/tinyshakespeare_byte.h5 "$SOURCE_DIR/inputs/tinyshakespeare.txt" >/dev/null
}

# A small batch for runs whose checks do not depend on it (faults, files,
# restarts): 8 sequences in micro-batches of 4 (two, for two stages or two
# replicas), one validation batch. The deck's 32 x 64 tokens took 0.3-0.6 s
# a step where the BLAS ran generic kernels (0.1-0.2 s through oneDNN's
# products, kernels/host/gemm.cpp), and most of the suite is such steps.
# Unquoted where used: the words are the arguments.
SMALL_BATCH="--set train.global_batch=8 --set train.micro_batch=4 --set train.eval_batches=1"

# Sequences of 32 tokens (the deck's 64 halved) for host-only layout tests
# whose steps are most of their time: what they compare (the same sums
# under another layout, a resume) does not depend on the length (alone: e2e.zero_recompute 39 s ->
# 28 s, e2e.offload 35 s -> 24 s; llama.sh and moe.sh gained under 10%
# and keep their decks' length, as do the scripts the GPU check runs).
SHORT_SEQ="--set model.seq_len=32"

# AdamW's eps for runs whose final parameters are held to 1e-5 in norm of
# another layout's (compare_checkpoints.py): 1e-6, not the decks' 1e-8, so
# that no weight's step is decided by rounding. Where a weight's gradient
# cancels over the batch to below eps, its step is lr * g / eps, and g's
# fp32 rounding (up to ~1e-9 where a tensor's gradients are ~1e-3) becomes
# up to a tenth of lr. Which weight lands there is chance: one weight of
# the MoE deck's h.0 o_proj at step 1 had g = -2.25e-9 on one rank and
# -1.36e-9 at cp 2, 9.6e-6 apart after the step, 1.03e-5 of the tensor in
# norm; over seeds, layouts and BLAS kernels the worst tensors spread from
# 4e-7 to that. At eps 1e-6 the term is at most lr * 1e-3 a step, 3.2e-6
# over six steps of the decks' warm-up (lr 3e-3 over 20 steps) even if it
# all fell on one weight of a tensor of norm 1: the bound holds by
# arithmetic, not by luck. Weights whose gradients are near 1e-6 take
# smaller steps (half, at 1e-6), the same in both runs; what a bug
# changes, the gradients, moves them as before.
STEADY_ADAMW="--set train.eps=1e-6"

# run_mpi NP ARGS...: the binary under mpirun with NP ranks. Training runs
# get a stated peak: measuring it (a large sgemm, only MFU's denominator)
# takes about 5 s of each run of a few seconds on two cores. train_tiny.sh
# sets MEASURE_PEAK=1 and checks the measurement.
run_mpi() {
  local np=$1
  shift
  if [ "${1:-}" = train ] && [ -z "${MEASURE_PEAK:-}" ]; then
    set -- "$@" --set run.peak_tflops=1
  fi
  mpirun -np "$np" "$MPIFORMER" "$@"
}

# train_layout DIR DP PP TP [ARGS...]: the caller's $DECK with its
# "${common[@]}" under that layout into DIR (its log DIR.log), the test
# failing with the log if the run fails.
train_layout() {
  local dir=$1 dp=$2 pp=$3 tp=$4
  shift 4
  run_mpi $((dp * pp * tp)) train "$DECK" "${common[@]}" --set parallel.dp="$dp" \
    --set parallel.pp="$pp" --set parallel.tp="$tp" --set run.dir="$dir" "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "$dir failed"; }
}

# The losses of a metrics file, one per line (timings stripped).
losses_of() { grep -o '"loss": [^,]*' "$1"; }
# The loss of every step of a metrics.jsonl as JSON ({"1": 5.54, ...}),
# the last time it was logged (a restart redoes some), keys sorted.
last_losses() {
  python3 - "$1" <<'PY'
import json, sys
out = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "loss" in j: out[j["step"]] = j["loss"]
print(json.dumps(out, sort_keys=True))
PY
}

# same_losses GOT.jsonl REF.jsonl STEPS TOLERANCE LABEL: the last loss
# logged for each of steps 1..STEPS in GOT (a step redone after a restart
# counts once) within TOLERANCE relative of REF's.
same_losses() {
  python3 - "$@" <<'PY'
import json, sys
def last_per_step(path):
    out = {}
    for j in map(json.loads, open(path)):
        if "loss" in j: out[j["step"]] = j["loss"]
    return out
got, ref = last_per_step(sys.argv[1]), last_per_step(sys.argv[2])
steps, tol, label = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
assert sorted(got) == list(range(1, steps + 1)), sorted(got)
bad = [s for s in ref if abs(got[s] - ref[s]) > tol * abs(ref[s])]
worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
assert not bad, f"steps {bad[:5]} differ: {[(got[s], ref[s]) for s in bad[:3]]}"
print(f"{label}: final loss {got[steps]} vs {ref[steps]} uninterrupted, worst step rel {worst:.1e}")
PY
}

# mean_sent_mb METRICS.jsonl: the mean over the steps of dp_sent_mb, the
# bytes a rank sent its data-parallel group a step (the run's own count).
mean_sent_mb() {
  python3 -c 'import json,sys
v=[j["dp_sent_mb"] for j in map(json.loads, open(sys.argv[1])) if "dp_sent_mb" in j]
print(sum(v) / len(v))' "$1"
}

# compare REF.jsonl GOT.jsonl TOLERANCE LABEL: the loss, grad norm and
# validation loss of every step within TOLERANCE relative (0: exactly), and
# a Mixture of Experts' routing metrics where the reference has them.
compare() {  # reference.jsonl got.jsonl tolerance label
  python3 - "$@" <<'PY'
import json, sys
ref = [j for j in map(json.loads, open(sys.argv[1])) if "step" in j]
got = [j for j in map(json.loads, open(sys.argv[2])) if "step" in j]
tol = float(sys.argv[3])
assert [g["step"] for g in got] == [r["step"] for r in ref], (sys.argv[4], len(got))
worst = 0.0
for r, g in zip(ref, got):
    for key in ("loss", "grad_norm", "val_loss", "aux_loss", "z_loss", "expert_load_min",
                "expert_load_max", "dropped_fraction"):
        if key in r and (r[key] is None or g[key] is None):  # NaN (a skipped step's norm)
            assert r[key] is None and g[key] is None, f"{sys.argv[4]}: step {r['step']} {key}"
        elif key in r:
            rel = abs(g[key] - r[key]) / abs(r[key]) if r[key] != 0 else abs(g[key])
            worst = max(worst, rel)
            ok = g[key] == r[key] if tol == 0 else rel <= tol
            assert ok, f"{sys.argv[4]}: step {r['step']} {key} {g[key]!r} vs {r[key]!r} (rel {rel:.2e})"
print(f"{sys.argv[4]}: matches, worst relative difference {worst:.2e}")
PY
}

# same_run REF DIR LABEL: DIR's run gives REF's numbers (compare, 1e-5) and
# every tensor of its final checkpoint (step 6) within 1e-5 in norm of
# REF's (compare_checkpoints.py: h5dump, no mpiformer code).
same_run() {
  compare "$1/metrics.jsonl" "$2/metrics.jsonl" 1e-5 "$3"
  python3 "$SOURCE_DIR/tests/e2e/compare_checkpoints.py" "$1/checkpoints/step_00000006.h5" \
    "$2/checkpoints/step_00000006.h5" 1e-5 /model || fail "$3: final parameters differ from $1's"
}

# resume_run SEG "DP PP TP [ARGS...]" DIR "DP PP TP [ARGS...]" [ARGS...]:
# the caller's deck under the first layout into SEG, stopped after step 3,
# then resumed from its checkpoint under the second into DIR (each
# layout's words to its run, the last ARGS to both).
resume_run() {
  local seg=$1 from=$2 dir=$3 to=$4
  shift 4
  train_layout "$seg" $from --set train.stop_at=3 "$@"
  mkdir -p "$dir" && cp -r "$seg/checkpoints" "$seg/metrics.jsonl" "$dir/"
  train_layout "$dir" $to "$@"
  grep -q "resumed from .*step_00000003.h5: step 3" "$dir.log" || fail "$dir: no resume line"
}

# generates CKPT: greedy generate from CKPT continues "ROMEO:" (gen.txt).
generates() {
  "$MPIFORMER" generate "$1" --prompt "ROMEO:" --tokens 20 --temperature 0 >gen.txt 2>&1 ||
    { cat gen.txt; fail "generate failed"; }
  grep -q "^ROMEO:" gen.txt || { cat gen.txt; fail "generate: no continuation"; }
}

# numpy_logits CKPT HF_DIR: llama_numpy.py's independent forward over the
# Hugging Face directory gives generate's logits of CKPT (12 greedy byte
# tokens after "ROMEO:"). $PY: a Python with numpy (.ci/deps.sh's), which
# need_numpy checks.
PY=${PYTHON_NUMPY:-/usr/bin/python3}
need_numpy() {
  "$PY" -c "import numpy" 2>/dev/null || fail "$PY has no numpy (.ci/deps.sh installs python3-numpy)"
}
numpy_logits() {
  "$MPIFORMER" generate "$1" --prompt "ROMEO:" --tokens 12 --temperature 0 --logits logits.bin \
    >gen12.txt 2>gen12.err || { cat gen12.err; fail "generate --logits"; }
  head -c -1 gen12.txt | od -An -tu1 -v >ids.txt  # byte tokens: the text's bytes are the ids
  "$PY" "$SOURCE_DIR/tests/e2e/llama_numpy.py" logits "$2" ids.txt logits.bin
}
