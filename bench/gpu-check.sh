#!/usr/bin/env bash
# The GPU check, made for the one short window on a lent GPU (15 minutes of
# device time in all, start-up included; at most 10 minutes a command; at
# most 8 files back from $OUT). One command, no network, phases in order of
# value, each with a time budget, the whole run under DEADLINE (430 s) so
# that a fix and a second run still fit:
#   0. preflight (20 s): the GPU seen by the driver and by CUDA, every
#      binary's libraries resolved, `mpirun -np 1 true`, NCCL's start; each
#      failure said plainly with what to try;
#   1. the benchmark: tokens/s and MFU of gpt2-124m and gpt2-350m at
#      seq_len 1024 in bf16, against the bf16 GEMM peak cuBLASLt reaches in
#      the same run; every logged loss finite and the last below the first;
#   2. a 2-step gpt2-124m fp32 run on the GPU against the same run on the
#      host back end (step losses within 1e-4 relative); then fp16 with
#      dynamic loss scaling, and [train] offload = "host" against the
#      benchmark run's losses;
#   2d. checkpoints in the background against synchronous ones: the same
#      losses, every file verified, the stall per save (with the start-up
#      health check on the device);
#   3. the same device-against-host comparison on llama-160m with
#      grouped-query attention, and on it as a Mixture of Experts;
#   4. the kernel, stage and communicator tests (ctest, gpu label);
#   5. compute-sanitizer memcheck and racecheck over our kernels' tests;
#   6. the end-to-end GPU scripts, with what time is left.
# A phase gets its budget plus what earlier phases left unused; one that
# overruns is stopped with everything it started (mpirun and its ranks,
# found by session: Open MPI puts each rank in a process group of its own),
# and one that cannot have 10 s is skipped, said so. Ranks are never bound
# to a core (`--bind-to none`): the host comparisons use every core, and
# each run's thread count is in the summary.
#
# What comes back: $OUT/summary.txt (a line per phase: pass, FAIL,
# TIMEOUT or SKIPPED, its figure and seconds), $OUT/table.txt (the
# benchmark), and $OUT/gpu-check-logs.tar.gz (every log, metrics file and
# test output), packed at exit whatever the exit; the summary is printed
# last on stdout. It exits non-zero when no GPU is usable (saying "no usable
# GPU"), or when any phase failed, timed out or had no time.
#
# Runs from a native cuda build (build/cuda, built here if missing and the
# dependencies are installed) or from the bundle bench/make-gpu-bundle.sh
# makes (.bundle/mpiformer-gpu.tar.xz) on a machine without our
# dependencies; the bundle's binaries find its libraries by their own
# RUNPATH, so the machine's own tools keep theirs.
#   OUT=bench-out/gpu  FROM=auto|build|bundle  BUILD_DIR=build/cuda  DEADLINE=430
#   MODELS="gpt2-124m:16 gpt2-350m:16" (deck:micro_batch)  SEQ=1024  STEPS=15
#   LOG_EVERY=5  PRECISION=bf16  DEVICE=cuda  CMP_SEQ=1024  CMP_MB=2  FP16_STEPS=10
#   ASYNC_MODEL=(the first of MODELS)  ASYNC_STEPS=150  ASYNC_EVERY=50
#   OFFLOAD_ZERO=3: phase 2c's [parallel] zero (3: the shard's gradients offloaded too)
#   BENCH=1 COMPARE=1 FP16=1 OFFLOAD=1 ASYNC=1 LLAMA=1 MOE=1 TESTS=1 SANITIZE=1 E2E=1: phases on/off
#   BUDGET_<phase>=seconds: a phase's budget (preflight bench compare fp16
#     offload async llama moe tests sanitize e2e; bench, sanitize per run)
#   UNIT_TESTS=regex: ctest -R for phase 4 (default: the gpu label's unit tests)
#   SANITIZE_FILTER=gtest filter for phase 5 (default: all but cuBLASLt's GEMMs)
#   TRAIN_EXTRA="": words added to every run (the rehearsal shrinks the model)
# MPIFORMER_REHEARSE_GPU=1 (src/core/test_hooks.hpp) rehearses every step
# short of the device on the host back end of the cpu build, at small
# shapes and in fp32; CI runs it (rehearsal.gpu_check,
# tests/gpu/gpu_check_limits.sh), and checks the limits above: the files
# back, their names and depth, the summary last, the deadline, and a phase
# stopped at its budget leaving nothing running.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REHEARSE=${MPIFORMER_REHEARSE_GPU:-0}
if [ "$REHEARSE" = 1 ]; then
  : "${DEVICE:=cpu}" "${PRECISION:=fp32}" "${SEQ:=64}" "${MODELS:=gpt2-124m:1}" "${STEPS:=3}"
  : "${LOG_EVERY:=1}" "${CMP_SEQ:=32}" "${CMP_MB:=1}" "${FROM:=build}" "${FP16_STEPS:=4}"
  : "${ASYNC_STEPS:=6}" "${ASYNC_EVERY:=2}"
  : "${BUILD_DIR:=build/cpu}" "${E2E:=0}" "${UNIT_TESTS:=^emulated\.(emulator|local_comm)$}"
  # gpt2-124m cut to two narrow layers: the phases, keys and checks are the
  # same at any shape.
  : "${TRAIN_EXTRA:=--set model.n_layer=2 --set model.n_embd=256 --set model.n_head=4}"
fi
OUT=${OUT:-$ROOT/bench-out/gpu}
FROM=${FROM:-auto}
BUILD_DIR=${BUILD_DIR:-build/cuda}
STEPS=${STEPS:-15}
LOG_EVERY=${LOG_EVERY:-5}
MODELS=${MODELS:-gpt2-124m:16 gpt2-350m:16}
SEQ=${SEQ:-1024}
PRECISION=${PRECISION:-bf16}
DEVICE=${DEVICE:-cuda}
CMP_SEQ=${CMP_SEQ:-1024}
CMP_MB=${CMP_MB:-2}
FP16_STEPS=${FP16_STEPS:-10}
ASYNC_MODEL=${ASYNC_MODEL:-${MODELS%% *}}
ASYNC_STEPS=${ASYNC_STEPS:-150}
ASYNC_EVERY=${ASYNC_EVERY:-50}
DEADLINE=${DEADLINE:-430}
UNIT_TESTS=${UNIT_TESTS:-^gpu\.(kernels|gemm|stage|offload|local_comm|host_staged|context_ring|stage_comms|nccl_communicator)$}
E2E_TESTS='^gpu\.(train_tiny|calibrate|layout_equivalence|tensor_parallel)$'
SANITIZE_FILTER=${SANITIZE_FILTER:--*Matmul*}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# What comes back is these three files; everything else is packed.
rm -f "$OUT/summary.txt" "$OUT/table.txt" "$OUT/gpu-check-logs.tar.gz"
SUMMARY=$OUT/summary.txt TABLE=$OUT/table.txt ARCHIVE=$OUT/gpu-check-logs.tar.gz
: >"$SUMMARY"
W=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")
LOGS=$W/logs
mkdir -p "$LOGS" "$W/data"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI 4.1 binds a lone rank to core 0, and the host back end sizes its
# thread pool by that affinity: one core of sixteen for the host
# comparisons. Every launch here, ctest's and the scripts' too, unbound.
export OMPI_MCA_hwloc_base_binding_policy=none

say() { echo "== $*" | tee -a "$SUMMARY"; }
failed=()
# record PHASE STATUS SECONDS [FIGURE]: the phase's summary line.
record() {
  printf '%-36s %-8s %4d s  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$SUMMARY"
  case $2 in pass) ;; *) failed+=("$1 ($2)") ;; esac
}

# The session id's every process (a phase's mpirun, its ranks, a test's
# children), from /proc: no procps needed on a bare image.
kill_session() {
  local sid=$1 sig=$2 p stat rest st ppid pgrp sess
  for p in /proc/[0-9]*; do
    stat=$(cat "$p/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    read -r st ppid pgrp sess _ <<<"$rest"
    [ "$sess" = "$sid" ] && kill "-$sig" "${p#/proc/}" 2>/dev/null
  done
  return 0
}
proc_state() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) }
  echo "${s%% *}"
}
CURRENT_SESSION=
# run_limited LIMIT LOG CMD...: CMD in a session of its own, output to LOG;
# past LIMIT seconds the session is stopped (TERM, then KILL) and 124
# returned. Whatever the session left running is killed when CMD ends.
run_limited() {
  local limit=$1 log=$2
  shift 2
  setsid "$@" >"$log" 2>&1 </dev/null &
  local pid=$! t0=$SECONDS st
  CURRENT_SESSION=$pid
  while :; do
    st=$(proc_state "$pid")
    [ -z "$st" ] || [ "$st" = Z ] && break
    if ((SECONDS - t0 >= limit)); then
      kill_session "$pid" TERM
      sleep 2
      kill_session "$pid" KILL
      wait "$pid" 2>/dev/null
      echo "gpu-check: stopped after its limit of $limit s" >>"$log"
      CURRENT_SESSION=
      return 124
    fi
    sleep 0.2
  done
  wait "$pid"
  local rc=$?
  kill_session "$pid" KILL
  CURRENT_SESSION=
  return $rc
}

# Budgets add up to DEADLINE; a phase may use what earlier ones left.
declare -A BUDGET=([preflight]=20 [bench]=40 [compare]=50 [fp16]=20 [offload]=30 [async]=70
                   [llama]=40 [moe]=40 [tests]=45 [sanitize]=25 [e2e]=50)
for k in "${!BUDGET[@]}"; do
  v=BUDGET_$k
  [ -n "${!v:-}" ] && BUDGET[$k]=${!v}
done
BANKED=0
# phase KEY NAME: true with LIMIT set to the seconds it may run; false (and
# recorded SKIPPED) when it cannot have 10.
phase() {
  BANKED=$((BANKED + BUDGET[$1]))
  LIMIT=$((BANKED - SECONDS))
  local to_deadline=$((DEADLINE - SECONDS))
  ((LIMIT > to_deadline)) && LIMIT=$to_deadline
  ((LIMIT >= 10)) && return 0
  record "$2" SKIPPED 0 "$((DEADLINE - SECONDS)) s left of DEADLINE=$DEADLINE"
  return 1
}
# threads LOG: the host thread count a run used, from its log.
threads() { sed -n 's/.*; \([0-9]*\) BLAS threads;.*/threads \1/p' "$1" | head -1; }

finish() {
  local rc=$?
  trap - EXIT TERM INT HUP
  [ -n "$CURRENT_SESSION" ] && kill_session "$CURRENT_SESSION" KILL
  if [ ${#failed[@]} -gt 0 ]; then
    say "gpu-check: FAILED or incomplete in ${SECONDS} s: ${failed[*]}"
    [ "$rc" = 0 ] && rc=1
  elif [ "$rc" = 0 ]; then
    say "gpu-check: every phase passed in ${SECONDS} s"
  else
    say "gpu-check: stopped (exit $rc) after ${SECONDS} s"
  fi
  # Logs can be large (a sanitizer's thousands of reports): the last MiB of each.
  find "$LOGS" -type f -size +1M -exec sh -c 'tail -c 1M "$1" >"$1.t" && mv "$1.t" "$1"' _ {} \;
  cp "$SUMMARY" "$LOGS/" 2>/dev/null
  [ -f "$TABLE" ] && cp "$TABLE" "$LOGS/"
  tar -C "$W" -czf "$ARCHIVE" logs 2>/dev/null || echo "gpu-check: could not pack $ARCHIVE"
  rm -rf "$W"
  echo
  echo "==== gpu-check summary ($OUT: summary.txt, table.txt, gpu-check-logs.tar.gz)"
  cat "$SUMMARY"
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM INT HUP

# ---- 0. the binaries, and the preflight --------------------------------
bundle=$ROOT/.bundle/mpiformer-gpu.tar.xz
if [ "$FROM" = bundle ] || { [ "$FROM" = auto ] && [ ! -x "$BUILD_DIR/app/mpiformer" ] && [ -f "$bundle" ]; }; then
  U=$W/bundle
  mkdir -p "$U"
  # Python's lzma, not tar -J: a bare GPU image may lack the xz program.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$U" ||
    { say "cannot unpack $bundle"; exit 1; }
  P=$U/mpiformer-gpu
  # Open MPI finds its plugins, help texts and daemon under OPAL_PREFIX;
  # PMIx its plugins through its own component path. The carried binaries
  # find the carried libraries by RUNPATH, and cuBLASLt and NCCL in the
  # CUDA toolkit's folders; other places that hold them (pip's nvidia-*
  # wheels) go on LD_LIBRARY_PATH, never a folder of the system's own
  # libraries, which would come before a RUNPATH.
  libs=
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in $(ls -d "$d"/nvidia/*/lib/libcublasLt.so.* "$d"/nvidia/*/lib/libnccl.so.* 2>/dev/null); do
      libs=$libs:$(dirname "$lib")
    done
  done
  cat >"$U/env.sh" <<ENV
export OPAL_PREFIX=$P PATH=$P/bin:\$PATH
export OMPI_MCA_mca_base_component_path=$P/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$P/pmix
${libs:+export LD_LIBRARY_PATH=${libs#:}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}}
ENV
  source "$U/env.sh"
  # The build tree's CTest files name this machine's paths instead of the
  # build machine's.
  source "$P/origin"
  find "$P/build" \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) \
    -exec sed -i \
    -e "s|$BUILD|$P/build|g" -e "s|$MPIEXEC|$P/bin/mpirun|g" -e "s|$SOURCE|$ROOT|g" {} +
  BUILD=$P/build
  say "from the bundle ($(du -m "$bundle" | cut -f1) MiB); glibc here $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}'), the bundle needs $(cat "$P/glibc-needed")"
else
  if [ ! -x "$BUILD_DIR/app/mpiformer" ]; then
    [ "$REHEARSE" = 1 ] && { say "no $BUILD_DIR: build the cpu preset first"; exit 1; }
    bash .ci/deps.sh && cmake --preset cuda >/dev/null && cmake --build --preset cuda ||
      { say "no $BUILD_DIR, no bundle, and the cuda preset does not build here"; exit 1; }
  fi
  BUILD=$(cd "$BUILD_DIR" && pwd)
  say "from the build tree $BUILD"
fi
MPIFORMER=$BUILD/app/mpiformer
say "$(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $("$MPIFORMER" --version 2>&1 | head -1)"
[ "$REHEARSE" = 1 ] &&
  say "REHEARSAL on the host back end (MPIFORMER_REHEARSE_GPU=1): $DEVICE $PRECISION, no GPU involved"

phase preflight "0. preflight"
t0=$SECONDS
pre=()
if [ "$REHEARSE" != 1 ]; then
  if command -v nvidia-smi >/dev/null; then
    gpu=$(timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
          --format=csv,noheader 2>&1) || pre+=("nvidia-smi fails: $gpu (is the driver loaded?)")
    say "GPU: $gpu"
  else
    say "GPU: no nvidia-smi on the PATH"
  fi
  # Nothing below means anything without a GPU: say so and fail, rather
  # than report a check of skipped tests as passed.
  if ! probe=$(timeout 20 "$BUILD/tests/mpiformer_gpu_probe" 2>&1); then
    record "0. preflight" FAIL $((SECONDS - t0)) "${probe#SKIP: }"
    say "${probe#SKIP: }: bench/gpu-check.sh checks a GPU and has nothing to check here (try nvidia-smi; CUDA_VISIBLE_DEVICES)"
    exit 1
  fi
fi
# Every binary's libraries, with this environment.
missing=$(for f in "$MPIFORMER" "$BUILD"/tests/mpiformer_* "$BUILD"/bench/mpiformer_*; do
            [ -x "$f" ] || continue
            ldd "$f" 2>&1 | grep "not found" | sed "s|^|$(basename "$f"): |"
          done | sort -u)
[ -z "$missing" ] ||
  pre+=("unresolved libraries (cuBLASLt and NCCL come from this machine: point LD_LIBRARY_PATH at their folder): $(echo "$missing" | tr '\n' ';')")
if ! run_limited 15 "$LOGS/mpirun-true.log" mpirun -np 1 true; then
  pre+=("mpirun -np 1 true fails ($(tail -2 "$LOGS/mpirun-true.log" | tr '\n' ' ')): see OPAL_PREFIX, the plugins' path, TMPDIR")
fi
nccl=
if [ "$REHEARSE" != 1 ]; then
  nccl=$(timeout 20 "$BUILD/tests/mpiformer_gpu_probe" --nccl 2>&1 | tail -1)
  # One-rank groups need no NCCL: a failure here explains multi-GPU
  # failures only, so it is said but does not stop the check.
  say "NCCL: $nccl"
fi
if [ ${#pre[@]} -gt 0 ]; then
  for p in "${pre[@]}"; do say "preflight: $p"; done
  record "0. preflight" FAIL $((SECONDS - t0)) "${pre[0]:0:120}"
  exit 1
fi
if ! run_limited 30 "$LOGS/prep.log" "$MPIFORMER" prep --tokenizer gpt2 --val-fraction 0.1 \
    --output "$W/data/tinyshakespeare_gpt2.h5" inputs/tinyshakespeare.txt; then
  record "0. preflight" FAIL $((SECONDS - t0)) "prep of the sample corpus: $(tail -1 "$LOGS/prep.log")"
  exit 1
fi
record "0. preflight" pass $((SECONDS - t0)) "${probe:-host only}; ${nccl:-no NCCL probe}"

# train NAME DECK LIMIT [--set ...]: one rank in $W/NAME, log in $LOGS/NAME.log.
read -r -a train_extra <<<"${TRAIN_EXTRA:-}"
[ ${#train_extra[@]} -eq 0 ] || say "every run with: ${TRAIN_EXTRA}"
train() {
  local name=$1 deck=$2 limit=$3
  shift 3
  mkdir -p "$W/$name"
  run_limited "$limit" "$LOGS/$name.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$W" \
    mpirun -np 1 "$MPIFORMER" train "$ROOT/inputs/$deck.toml" \
    --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.resume=never \
    --set checkpoint.dir="$W/$name/ckpt" --set run.dir="$W/$name" "$@" "${train_extra[@]}"
}
# why RC LOG: a failed run's cause in a few words.
why() {
  [ "$1" = 124 ] && { echo TIMEOUT; return; }
  echo FAIL
}

# ---- 1. the benchmark ----------------------------------------------------
if [ "${BENCH:-1}" = 1 ]; then
  printf '%-10s %-5s %3s %5s %12s %7s %12s %9s\n' model prec mb seq tokens/s MFU peak_TFLOP/s step_ms \
    >"$TABLE"
  for spec in $MODELS; do
    model=${spec%%:*} mb=${spec##*:}
    name="1. bench $model"
    phase bench "$name" || continue
    t0=$SECONDS
    train "$model" "$model" "$LIMIT" --set run.device="$DEVICE" \
      --set train.precision="$PRECISION" --set model.seq_len="$SEQ" --set train.micro_batch="$mb" \
      --set train.global_batch="$mb" --set train.steps="$STEPS" --set train.warmup_steps=2 \
      --set train.log_every="$LOG_EVERY" --set checkpoint.at_end=false
    rc=$?
    if [ $rc != 0 ]; then
      record "$name" "$(why $rc)" $((SECONDS - t0)) "$(tail -1 "$LOGS/$model.log")"
      continue
    fi
    cp "$W/$model/metrics.jsonl" "$LOGS/$model.metrics.jsonl"
    if ls "$W/$model/ckpt"/step_*.h5 >/dev/null 2>&1; then
      record "$name" FAIL $((SECONDS - t0)) "a checkpoint was written (checkpoint.at_end=false)"
      continue
    fi
    peak=$(sed -n 's/.*peak \([0-9.]*\) GFLOP\/s.*/\1/p' "$LOGS/$model.log" | head -1)
    # The last logged interval: steps after the warm-up (plans, clocks).
    if row=$(python3 - "$W/$model/metrics.jsonl" "$model" "$PRECISION" "$mb" "$SEQ" "$peak" \
             2>"$LOGS/$model.check" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
model, prec, mb, seq, peak = sys.argv[2:7]
losses = [r["loss"] for r in rows]
assert len(losses) >= 2, f"{model}: {len(losses)} logged step(s), need two to see the loss fall"
# A non-finite loss is written as null.
assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses), f"{model}: losses {losses}"
assert losses[-1] < losses[0], f"{model}: the loss did not fall: {losses}"
r = rows[-1]
print(f"{model:<10} {prec:<5} {int(mb):3d} {int(seq):5d} {r['tokens_per_s']:12.0f} {100*r['mfu']:6.1f}% "
      f"{float(peak)/1e3:12.1f} {r['step_ms']:9.1f}")
PY
    ); then
      echo "$row" >>"$TABLE"
      record "$name" pass $((SECONDS - t0)) "$(awk '{print $5 " tokens/s, MFU " $6}' <<<"$row"); $(threads "$LOGS/$model.log")"
    else
      record "$name" FAIL $((SECONDS - t0)) "$(tail -1 "$LOGS/$model.check")"
    fi
  done
  say "table (MFU: 6N + 12LTC FLOPs per token over the peak measured in the run: a cuBLASLt 8192^3 GEMM of the precision on a GPU)"
  tee -a "$SUMMARY" <"$TABLE"
fi

# ---- 2, 3. the device against the host ------------------------------------
# compare_on KEY NAME DECK [--set ...]: 2 steps of the deck on the device and
# on the host (same init and data), each with half the phase's time; step
# losses within 1e-4 relative.
compare_on() {
  local key=$1 name=$2 deck=$3
  shift 3
  phase "$key" "$name" || return 0
  local t0=$SECONDS half=$((LIMIT / 2)) tag=${key}
  local cmp=("$deck" "$half" --set train.precision=fp32 --set model.seq_len="$CMP_SEQ"
             --set train.micro_batch="$CMP_MB" --set train.global_batch="$CMP_MB" --set train.steps=2
             --set train.warmup_steps=0 --set train.log_every=1 --set checkpoint.at_end=false
             --set run.peak_tflops=1 "$@")
  train "cmp-$tag-device" "${cmp[@]}" --set run.device="$DEVICE"
  local rc=$?
  if [ $rc != 0 ]; then
    record "$name" "$(why $rc)" $((SECONDS - t0)) "device run: $(tail -1 "$LOGS/cmp-$tag-device.log")"
    return 0
  fi
  cmp[1]=$((LIMIT - (SECONDS - t0)))
  train "cmp-$tag-host" "${cmp[@]}" --set run.device=cpu
  rc=$?
  if [ $rc != 0 ]; then
    record "$name" "$(why $rc)" $((SECONDS - t0)) "host run: $(tail -1 "$LOGS/cmp-$tag-host.log")"
    return 0
  fi
  local out
  if out=$(python3 - "$W/cmp-$tag-device/metrics.jsonl" "$W/cmp-$tag-host/metrics.jsonl" 2>&1 <<'PY'
import json, sys
dev, host = ([json.loads(l)["loss"] for l in open(p) if '"grad_norm"' in l] for p in sys.argv[1:3])
assert len(dev) == len(host) == 2, (dev, host)
rel = [abs(a - b) / abs(b) for a, b in zip(dev, host)]
# 1e-4: fp32 in another summation order (cuBLASLt's tiling against
# OpenBLAS's) over 124M parameters and one AdamW step; a wrong kernel
# moves a loss of ~11 nats by far more.
assert max(rel) <= 1e-4, f"step losses {dev} on the device, {host} on the host: rel {rel}"
print(f"losses {dev[0]:.6f} {dev[1]:.6f}, rel {rel[0]:.1e} {rel[1]:.1e} from the host's")
PY
  ); then
    record "$name" pass $((SECONDS - t0)) "$out; host $(threads "$LOGS/cmp-$tag-host.log")"
  else
    echo "$out" >"$LOGS/cmp-$tag.check"
    record "$name" FAIL $((SECONDS - t0)) "$(tail -1 <<<"$out")"
  fi
}
[ "${COMPARE:-1}" = 1 ] && compare_on compare "2. gpt2-124m $DEVICE vs host fp32" gpt2-124m

# 2b. fp16 with dynamic loss scaling on the device: the loss falls and the
# scale is logged (the kernels' fp16 instances are in the tests below).
if [ "${FP16:-1}" = 1 ] && phase fp16 "2b. gpt2-124m fp16"; then
  t0=$SECONDS
  train fp16 gpt2-124m "$LIMIT" --set run.device="$DEVICE" --set train.precision=fp16 \
    --set model.seq_len="$SEQ" --set train.micro_batch=4 --set train.global_batch=4 \
    --set train.steps="$FP16_STEPS" --set train.warmup_steps=2 --set train.log_every=1 \
    --set checkpoint.at_end=false
  rc=$?
  if [ $rc != 0 ]; then
    record "2b. gpt2-124m fp16" "$(why $rc)" $((SECONDS - t0)) "$(tail -1 "$LOGS/fp16.log")"
  elif out=$(python3 - "$W/fp16/metrics.jsonl" 2>&1 <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
applied = [r for r in rows if not r.get("overflow")]
assert all(isinstance(r["loss"], float) and math.isfinite(r["loss"]) for r in rows), rows
assert applied[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
print(f"losses {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, loss scale "
      f"{rows[-1]['loss_scale']:g}, {rows[-1]['overflows']} overflow(s), "
      f"{rows[-1]['tokens_per_s']:.0f} tokens/s")
PY
  ); then
    record "2b. gpt2-124m fp16" pass $((SECONDS - t0)) "$out"
  else
    record "2b. gpt2-124m fp16" FAIL $((SECONDS - t0)) "$(tail -1 <<<"$out")"
  fi
fi

# 2c. Offload on the device: the host's AdamW over the state in host
# memory, gradients down and weights up by block; at [parallel] zero
# OFFLOAD_ZERO (3 by default: ZeRO on a group of one) the shard's
# gradients live in host memory too, each block's sums coming down during
# backward (train/zero_shards.hpp), and the summary gets the run's
# measured memory against the accounting's. The update is bit for bit
# the device's; the rest of the step is the same kernels on the same
# data, so the losses match to the GPU's run-to-run reproducibility
# (1e-5 relative: far below what a wrong update moves in 15 steps; the
# gradient norm is summed on the host there, another order in double).
spec=${MODELS##* }
model=${spec%%:*} mb=${spec##*:}
if [ "${OFFLOAD:-1}" = 1 ] && [ -f "$LOGS/$model.metrics.jsonl" ] && phase offload "2c. offload host ($model)"; then
  t0=$SECONDS
  train offload "$model" "$LIMIT" --set run.device="$DEVICE" \
    --set train.precision="$PRECISION" --set model.seq_len="$SEQ" --set train.micro_batch="$mb" \
    --set train.global_batch="$mb" --set train.steps="$STEPS" --set train.warmup_steps=2 \
    --set train.log_every="$LOG_EVERY" --set checkpoint.at_end=false --set train.offload=host \
    --set parallel.zero="${OFFLOAD_ZERO:-3}"
  rc=$?
  if [ $rc != 0 ]; then
    record "2c. offload host ($model)" "$(why $rc)" $((SECONDS - t0)) "$(tail -1 "$LOGS/offload.log")"
  elif out=$(python3 - "$LOGS/$model.metrics.jsonl" "$W/offload/metrics.jsonl" 2>&1 <<'PY'
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if '"tokens_per_s"' in l]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert [r["step"] for r in a] == [r["step"] for r in b] and b, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
assert worst <= 1e-5, f"offload host: losses differ from none's by {worst:.2e} relative"
print(f"{len(b)} logged steps within {worst:.1e} of none's; tokens/s "
      f"{b[-1]['tokens_per_s']:.0f} against {a[-1]['tokens_per_s']:.0f} "
      f"({b[-1]['tokens_per_s'] / a[-1]['tokens_per_s']:.2f}x)")
PY
  ); then
    record "2c. offload host ($model)" pass $((SECONDS - t0)) "$out"
    grep -E "^offload:|^  rank 0 " "$LOGS/offload.log" >>"$SUMMARY"
  else
    record "2c. offload host ($model)" FAIL $((SECONDS - t0)) "$(tail -1 <<<"$out")"
  fi
fi

# 2d. Checkpoints in the background on the device (issue 50): the same
# run saving every ASYNC_EVERY steps, synchronously and with
# [checkpoint] async = true. Losses within 1e-5 relative (the GPU's
# run-to-run reproducibility: a save changes nothing that trains); every
# background file verifies as a resume would read it; the stall per save
# (what training stopped for) is reported, the synchronous one beside it.
# The first run also runs the start-up health check on the device.
if [ "${ASYNC:-1}" = 1 ] && phase async "2d. async checkpoints (${ASYNC_MODEL%%:*})"; then
  t0=$SECONDS
  amodel=${ASYNC_MODEL%%:*} amb=${ASYNC_MODEL##*:}
  acfg=(--set run.device="$DEVICE" --set train.precision="$PRECISION" --set model.seq_len="$SEQ"
        --set train.micro_batch="$amb" --set train.global_batch="$amb" --set train.steps="$ASYNC_STEPS"
        --set train.warmup_steps=2 --set train.log_every=1 --set checkpoint.every="$ASYNC_EVERY"
        --set checkpoint.keep=0)
  train async-sync "$amodel" $((LIMIT / 2)) "${acfg[@]}" --set checkpoint.async=false \
    --set run.health_check=on
  rc=$?
  if [ $rc = 0 ]; then
    train async-bg "$amodel" $((LIMIT - (SECONDS - t0))) "${acfg[@]}" --set checkpoint.async=true
    rc=$?
    [ $rc = 0 ] || rc_log=async-bg
  else
    rc_log=async-sync
  fi
  if [ $rc != 0 ]; then
    record "2d. async checkpoints (${ASYNC_MODEL%%:*})" "$(why $rc)" $((SECONDS - t0)) "$rc_log: $(tail -1 "$LOGS/$rc_log.log")"
  else
    bad=
    for f in "$W"/async-bg/ckpt/step_*.h5; do
      "$MPIFORMER" inspect "$f" >"$LOGS/async-inspect.log" 2>&1 && grep -q "datasets verify" "$LOGS/async-inspect.log" ||
        bad="$bad $(basename "$f")"
    done
    stalls=()
    for m in sync bg; do
      stalls+=("$(python3 bench/checkpoint_stalls.py "$LOGS/async-$m.log" "$W/async-$m/metrics.jsonl" "$ASYNC_STEPS" 2>&1)")
    done
    if [ -n "$bad" ]; then
      record "2d. async checkpoints (${ASYNC_MODEL%%:*})" FAIL $((SECONDS - t0)) "do not verify:$bad"
    elif out=$(python3 - "$W/async-sync/metrics.jsonl" "$W/async-bg/metrics.jsonl" "${stalls[@]}" 2>&1 <<'PY'
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if '"tokens_per_s"' in l]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert [r["step"] for r in a] == [r["step"] for r in b] and b, (len(a), len(b))
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
assert worst <= 1e-5, f"async: losses differ from the synchronous run's by {worst:.2e} relative"
(ns, fs, rs, ss, mb), (nb, fb, rb, sb, _) = (x.split() for x in sys.argv[3:5])
print(f"{nb} saves of {mb} MB on the way; stall sync {float(rs):.2f} s, async {float(rb):.2f} s "
      f"(first {float(fb):.2f} s), ratio {float(rb) / float(rs):.3f}; mean step {float(ss):.1f} / "
      f"{float(sb):.1f} ms; losses within {worst:.1e}")
PY
    ); then
      record "2d. async checkpoints (${ASYNC_MODEL%%:*})" pass $((SECONDS - t0)) "$out"
      grep -hE "^health:|checkpoint: (step|wrote)|training waited" "$LOGS/async-sync.log" "$LOGS/async-bg.log" >>"$SUMMARY"
    else
      record "2d. async checkpoints (${ASYNC_MODEL%%:*})" FAIL $((SECONDS - t0)) "$(tail -1 <<<"$out")"
    fi
  fi
fi

# 3. The Llama family at llama-160m's shapes with grouped-query attention
# (4 kv heads for 12 query heads), on the sample corpus's bytes: RMSNorm,
# rotary positions, SwiGLU and GQA attention at real sizes; then its MLPs as
# 8 experts of a quarter of their width, top 2, default capacity (some
# assignments dropped): the router, dispatch and combine kernels and the
# experts' GEMMs on their rows.
if [ "${LLAMA:-1}" = 1 ] || [ "${MOE:-1}" = 1 ]; then
  run_limited 30 "$LOGS/prep-byte.log" "$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 \
    --output "$W/data/tinyshakespeare_byte.h5" inputs/tinyshakespeare.txt ||
    record "3. byte-level data" FAIL 0 "$(tail -1 "$LOGS/prep-byte.log")"
fi
[ "${LLAMA:-1}" = 1 ] && compare_on llama "3. llama-160m $DEVICE vs host fp32" llama-160m --set model.n_kv_head=4
[ "${MOE:-1}" = 1 ] && compare_on moe "3b. llama-160m MoE $DEVICE vs host fp32" llama-160m \
  --set model.n_kv_head=4 --set model.experts=8 --set model.top_k=2 --set model.ffn_hidden=512

# ---- 4. the kernel, stage and communicator tests --------------------------
# ctest_phase KEY NAME REGEX: the tests in one session, stopped at the
# phase's limit (ctest --timeout does not override a test's own TIMEOUT).
ctest_phase() {
  local key=$1 name=$2 regex=$3 log=$LOGS/ctest-$1.log
  phase "$key" "$name" || return 0
  local t0=$SECONDS
  run_limited "$LIMIT" "$log" ctest --test-dir "$BUILD" -R "$regex" --output-on-failure
  local rc=$?
  local total passed skipped
  # "100% tests passed, 0 tests failed out of 8" (CMake 3.25), "100% tests passed
  # out of 8" (newer, when none failed).
  total=$(sed -n 's/.*tests \(passed\|failed\) out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  skipped=$(grep -c "\*\*\*Skipped\|(Skipped)" "$log")
  passed=$(grep -c "Passed" "$log")
  if [ $rc = 124 ]; then
    record "$name" TIMEOUT $((SECONDS - t0)) "$passed passed before the limit"
  elif [ -z "$total" ] || [ "$total" = 0 ] || [ "$skipped" -ge "$total" ]; then
    record "$name" FAIL $((SECONDS - t0)) "every test skipped or none ran ($skipped of ${total:-0})"
  elif [ $rc != 0 ]; then
    record "$name" FAIL $((SECONDS - t0)) "$(grep -E '\*\*\*Failed|Exception|Timeout' "$log" | awk '{print $4}' | tr '\n' ' ')"
  else
    record "$name" pass $((SECONDS - t0)) "$passed of $total passed, $skipped skipped"
  fi
}
[ "${TESTS:-1}" = 1 ] && ctest_phase tests "4. kernel, stage and comms tests" "$UNIT_TESTS"
# With two or more GPUs, NCCL's point-to-point paths too (ctest runs the
# communicator test on one rank; ranks sharing one GPU cannot use NCCL).
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${TESTS:-1}" = 1 ] && [ "${ngpu:-0}" -ge 2 ] && phase tests "4b. NCCL on $ngpu GPUs"; then
  t0=$SECONDS
  run_limited "$LIMIT" "$LOGS/nccl-$ngpu.log" mpirun -np "$ngpu" "$BUILD/tests/mpiformer_gpu_nccl_test"
  rc=$?
  record "4b. NCCL on $ngpu GPUs" "$([ $rc = 0 ] && echo pass || why $rc)" $((SECONDS - t0))
fi

# ---- 5. compute-sanitizer -------------------------------------------------
# The CPU emulation (tests/emulation) runs threads in a fixed order, so it
# cannot see data races: racecheck (shared memory) and memcheck
# (out-of-bounds, misaligned) look where the kernels really run.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ "$REHEARSE" = 1 ] && say "5. compute-sanitizer: not in a rehearsal (no GPU to watch)"
if [ "${SANITIZE:-1}" = 1 ] && [ "$REHEARSE" != 1 ]; then
  for tool in memcheck racecheck; do
    name="5. compute-sanitizer $tool"
    if [ -z "$sanitizer" ]; then
      record "$name" SKIPPED 0 "no compute-sanitizer here"
      continue
    fi
    phase sanitize "$name" || continue
    t0=$SECONDS
    # Our kernels only: cuBLASLt's (sm90_xmma*, nvjet*, cutlass) give false
    # positives under the sanitizer and are not ours to fix.
    exclude=()
    if "$sanitizer" --help 2>/dev/null | grep -- --kernel-name-exclude >/dev/null; then  # all read: no SIGPIPE
      for k in sm90_xmma nvjet cutlass; do exclude+=(--kernel-name-exclude "kns=$k"); done
    fi
    run_limited "$LIMIT" "$LOGS/sanitizer-$tool.log" "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "${exclude[@]}" "$BUILD/tests/mpiformer_gpu_kernels_test" --gtest_filter="$SANITIZE_FILTER"
    rc=$?
    if grep -q "Device not supported" "$LOGS/sanitizer-$tool.log"; then
      # Sandboxed runtimes refuse the sanitizer's debugger interface: no
      # verdict either way.
      record "$name" SKIPPED $((SECONDS - t0)) "device not supported by the sanitizer here"
    elif [ $rc = 0 ]; then
      record "$name" pass $((SECONDS - t0)) "clean (gpu.kernels, $SANITIZE_FILTER)"
    else
      record "$name" "$(why $rc)" $((SECONDS - t0)) "$(grep -m1 -E 'ERROR SUMMARY|Invalid|hazard' "$LOGS/sanitizer-$tool.log")"
    fi
  done
fi

# ---- 6. the end-to-end GPU scripts, last ----------------------------------
if [ "${E2E:-1}" = 1 ]; then
  ctest_phase e2e "6. end-to-end GPU scripts" "$E2E_TESTS"
else
  say "6. end-to-end GPU scripts: off (E2E=0; the rehearsal.* tests run them on the host)"
fi
exit 0
