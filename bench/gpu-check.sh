#!/usr/bin/env bash
# The GPU check for the one short window on a lent GPU, in one go and
# without network, most valuable first:
#  1. the benchmark: tokens/s and MFU of gpt2-124m and gpt2-350m at seq_len
#     1024 in bf16 (against the bf16 GEMM peak cuBLASLt reaches on the same
#     GPU in the same run), no final checkpoint; every logged loss finite
#     and the last below the first;
#  2. a 2-step gpt2-124m fp32 run on the GPU against the same run on the
#     host back end (same init and data): step losses within 1e-4 relative,
#     the only check of the CUDA path at real shapes;
#  2c. [train] offload = "host": the last benchmark model again with
#     AdamW's state (bf16: masters and moments) in host memory, updated on
#     the host: its logged losses and grad norms against the benchmark
#     run's, its tokens/s, and the device memory it measured;
#  3. `ctest -L gpu`;
#  3b. the 2-step device-against-host comparison again on llama-160m with
#     grouped-query attention;
#  3c. and on llama-160m as a Mixture of Experts (8 experts, top 2);
#  4. compute-sanitizer memcheck and racecheck over our own kernels.
# A short table and a summary come last. It exits non-zero when no GPU is
# usable, when every GPU test skipped, when a phase fails or has no time.
#
# Runs from a native cuda build (build/cuda, built here if missing and the
# dependencies are installed) or from the bundle bench/make-gpu-bundle.sh
# makes (.bundle/mpiformer-gpu.tar.xz) on a machine without our
# dependencies. Results go to $OUT (default bench-out/gpu).
#   OUT=bench-out/gpu  FROM=auto|build|bundle  BUILD_DIR=build/cuda
#   MODELS="gpt2-124m:16 gpt2-350m:16" (deck:micro_batch)  SEQ=1024  STEPS=15
#   LOG_EVERY=5  PRECISION=bf16  DEVICE=cuda  COMPARE=1  CMP_SEQ=1024  CMP_MB=2  FP16=1
#   TESTS=1  BENCH=1  OFFLOAD=1
#   TRAIN_EXTRA="": words added to every run (the rehearsal shrinks the model)
#   DEADLINE=540: seconds for the whole check (a lent GPU machine allows 600
#   per command); each phase gets a timeout, and phases that would start
#   too late are skipped and said so, so a hang cannot eat the rest.
# MPIFORMER_REHEARSE_GPU=1 (src/core/test_hooks.hpp) rehearses every step
# short of the device on the host back end of the cpu build, at small
# shapes and in fp32 (CI runs it: rehearsal.gpu_check): the phases, the
# keys read from the runs, the checks and the table, as on the device.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REHEARSE=${MPIFORMER_REHEARSE_GPU:-0}
if [ "$REHEARSE" = 1 ]; then
  : "${DEVICE:=cpu}" "${PRECISION:=fp32}" "${SEQ:=64}" "${MODELS:=gpt2-124m:1}" "${STEPS:=3}"
  : "${LOG_EVERY:=1}" "${CMP_SEQ:=32}" "${CMP_MB:=1}" "${TESTS:=0}" "${FROM:=build}"
  : "${FP16_STEPS:=4}"
  : "${BUILD_DIR:=build/cpu}"
  # gpt2-124m cut to two narrow layers: the phases, keys and checks are the
  # same at any shape, and the full model's five runs were most of the
  # suite's longest test on two cores.
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
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/summary.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
DEADLINE=${DEADLINE:-540}
# left: seconds before the deadline; phase NEED NAME: false (and logged,
# and the check incomplete) when NAME cannot have NEED seconds.
left() { echo $((DEADLINE - SECONDS)); }
failed=()
phase() {
  [ "$(left)" -ge "$1" ] && return 0
  log "$2: SKIPPED, $(left) s left of DEADLINE=$DEADLINE"
  failed+=("$2 (no time)")
  return 1
}

bundle=$ROOT/.bundle/mpiformer-gpu.tar.xz
if [ "$FROM" = bundle ] || { [ "$FROM" = auto ] && [ ! -x "$BUILD_DIR/app/mpiformer" ] && [ -f "$bundle" ]; }; then
  U=${TMPDIR:-/tmp}/mpiformer-gpu-$$
  mkdir -p "$U"
  # Python's lzma, not tar -J: a bare GPU image may lack the xz program.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$U" ||
    { echo "cannot unpack $bundle" >&2; exit 1; }
  P=$U/mpiformer-gpu
  # Open MPI finds its plugins, help texts and daemon under OPAL_PREFIX;
  # PMIx its plugins through its own component path. cuBLASLt and NCCL come
  # from this machine: the toolkit, the system, or pip's nvidia-* wheels.
  # env.sh holds it all, for running the carried binaries by hand too.
  libs=
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in $(ls -d "$d"/libcublasLt.so.* "$d"/libnccl.so.* "$d"/nvidia/*/lib/libcublasLt.so.* \
                 "$d"/nvidia/*/lib/libnccl.so.* 2>/dev/null); do
      libs=$libs:$(dirname "$lib")
    done
  done
  cat >"$U/env.sh" <<ENV
export OPAL_PREFIX=$P PATH=$P/bin:\$PATH
export OMPI_MCA_mca_base_component_path=$P/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$P/pmix
export LD_LIBRARY_PATH=$P/lib$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV
  source "$U/env.sh"
  # The build tree's CTest files name this machine's paths instead of the
  # build machine's.
  source "$P/origin"
  # (The unit tests are listed when ctest runs: their include scripts hold
  # paths too.)
  find "$P/build" \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) \
    -exec sed -i \
    -e "s|$BUILD|$P/build|g" -e "s|$MPIEXEC|$P/bin/mpirun|g" -e "s|$SOURCE|$ROOT|g" {} +
  BUILD=$P/build
  log "from the bundle ($(du -m "$bundle" | cut -f1) MiB), unpacked in $P"
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  log "glibc here $glibc; the bundle needs $(cat "$P/glibc-needed")"
else
  if [ ! -x "$BUILD_DIR/app/mpiformer" ]; then
    [ "$REHEARSE" = 1 ] && { echo "no $BUILD_DIR: build the cpu preset first" >&2; exit 1; }
    bash .ci/deps.sh && cmake --preset cuda >/dev/null && cmake --build --preset cuda ||
      { echo "no $BUILD_DIR, no bundle, and the cuda preset does not build here" >&2; exit 1; }
  fi
  BUILD=$(cd "$BUILD_DIR" && pwd)
  log "from the build tree $BUILD"
fi
MPIFORMER=$BUILD/app/mpiformer
if ldd "$MPIFORMER" | grep "not found" | tee -a "$OUT/summary.txt" | grep -q .; then
  echo "missing shared libraries (above): install them or point LD_LIBRARY_PATH at them" >&2
  exit 1
fi
log "$(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $("$MPIFORMER" --version)"
if [ "$REHEARSE" = 1 ]; then
  log "REHEARSAL on the host back end (MPIFORMER_REHEARSE_GPU=1): $DEVICE $PRECISION, no GPU involved"
else
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 |
      tee "$OUT/gpu.txt" | sed 's/^/== GPU: /' | tee -a "$OUT/summary.txt"
  fi
  # Nothing below means anything without a GPU: say so and fail, rather
  # than report a check of skipped tests as passed.
  if ! probe=$("$BUILD/tests/mpiformer_gpu_probe" 2>&1); then
    log "${probe#SKIP: }: bench/gpu-check.sh checks a GPU and has nothing to check on this machine"
    exit 1
  fi
  log "probe: $probe"
fi

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/data"
"$MPIFORMER" prep --tokenizer gpt2 --val-fraction 0.1 --output "$W/data/tinyshakespeare_gpt2.h5" \
  inputs/tinyshakespeare.txt >"$OUT/prep.log" 2>&1 || { cat "$OUT/prep.log"; exit 1; }
# train NAME DECK TIMEOUT [--set ...]: one rank, in $W/NAME, log in $OUT/NAME.log.
read -r -a train_extra <<<"${TRAIN_EXTRA:-}"
[ ${#train_extra[@]} -eq 0 ] || log "every run with: ${TRAIN_EXTRA}"
train() {
  local name=$1 deck=$2 limit=$3
  shift 3
  (cd "$W" && timeout "$limit" mpirun -np 1 "$MPIFORMER" train "$ROOT/inputs/$deck.toml" \
    --set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.resume=never \
    --set checkpoint.dir="$W/$name/ckpt" --set run.dir="$W/$name" "$@" "${train_extra[@]}") \
    >"$OUT/$name.log" 2>&1
}

# 1. The benchmark.
if [ "${BENCH:-1}" = 1 ]; then
  printf '%-10s %-5s %3s %5s %12s %7s %12s %9s\n' model prec mb seq tokens/s MFU peak_TFLOP/s step_ms \
    >"$OUT/table.txt"
  for spec in $MODELS; do
    model=${spec%%:*} mb=${spec##*:}
    phase 60 "bench $model" || continue
    log "bench: $model $DEVICE $PRECISION seq $SEQ micro_batch $mb, $STEPS steps"
    if ! train "$model" "$model" $(($(left) - 20)) --set run.device="$DEVICE" \
        --set train.precision="$PRECISION" --set model.seq_len="$SEQ" --set train.micro_batch="$mb" \
        --set train.global_batch="$mb" --set train.steps="$STEPS" --set train.warmup_steps=2 \
        --set train.log_every="$LOG_EVERY" --set checkpoint.at_end=false; then
      tail -20 "$OUT/$model.log"
      failed+=("bench $model")
      continue
    fi
    cp "$W/$model/metrics.jsonl" "$OUT/$model.metrics.jsonl"
    ! ls "$W/$model/ckpt"/step_*.h5 >/dev/null 2>&1 ||
      { log "bench $model: a checkpoint was written (checkpoint.at_end=false)"; failed+=("bench $model"); }
    peak=$(sed -n 's/.*peak \([0-9.]*\) GFLOP\/s.*/\1/p' "$OUT/$model.log" | head -1)
    # The last logged interval: steps after the warm-up (plans, clocks).
    if ! python3 - "$W/$model/metrics.jsonl" "$model" "$PRECISION" "$mb" "$SEQ" "$peak" \
        >>"$OUT/table.txt" 2>"$OUT/$model.check" <<'PY'
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
    then
      log "bench $model: FAILED: $(cat "$OUT/$model.check" | tail -1)"
      failed+=("bench $model")
    fi
  done
  log "table (MFU: 6N + 12LTC FLOPs per token over the peak measured in the run: a cuBLASLt 8192^3 GEMM of the precision on a GPU)"
  tee -a "$OUT/summary.txt" <"$OUT/table.txt"
fi

# 2. The device against the host, fp32, at gpt2-124m's real shapes.
# compare_on NAME DECK [--set ...]: 2 steps of the deck on the device and on
# the host (same init and data); step losses within 1e-4 relative.
compare_on() {
  local name=$1 deck=$2
  shift 2
  log "compare: $name fp32, 2 steps of $CMP_MB x $CMP_SEQ tokens, $DEVICE against cpu"
  local half=$(($(left) / 2 - 10))
  local cmp=("$deck" "$half" --set train.precision=fp32 --set model.seq_len="$CMP_SEQ"
             --set train.micro_batch="$CMP_MB" --set train.global_batch="$CMP_MB" --set train.steps=2
             --set train.warmup_steps=0 --set train.log_every=1 --set checkpoint.at_end=false
             --set run.peak_tflops=1 "$@")
  if train "cmp-$name-device" "${cmp[@]}" --set run.device="$DEVICE" &&
     train "cmp-$name-host" "${cmp[@]}" --set run.device=cpu; then
    python3 - "$W/cmp-$name-device/metrics.jsonl" "$W/cmp-$name-host/metrics.jsonl" 2>&1 <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
dev, host = ([json.loads(l)["loss"] for l in open(p) if '"grad_norm"' in l] for p in sys.argv[1:3])
assert len(dev) == len(host) == 2, (dev, host)
rel = [abs(a - b) / abs(b) for a, b in zip(dev, host)]
# 1e-4: fp32 in another summation order (cuBLASLt's tiling against
# OpenBLAS's) over 124M parameters and one AdamW step; a wrong kernel
# moves a loss of ~11 nats by far more.
assert max(rel) <= 1e-4, f"step losses {dev} on the device, {host} on the host: rel {rel}"
print(f"== compare: step losses {dev[0]:.6f} {dev[1]:.6f} on the device, rel {rel[0]:.1e} {rel[1]:.1e} from the host's")
PY
    [ "${PIPESTATUS[0]}" = 0 ] || failed+=("compare $name")
  else
    for f in "cmp-$name-device" "cmp-$name-host"; do [ -f "$OUT/$f.log" ] && tail -5 "$OUT/$f.log"; done
    failed+=("compare $name (a run failed)")
  fi
}
if [ "${COMPARE:-1}" = 1 ] && phase 90 "gpt2-124m: $DEVICE fp32 against the host"; then
  compare_on gpt2-124m gpt2-124m
fi

# 2b. fp16 with dynamic loss scaling on the device: the loss falls and the
# scale is logged (the kernels' fp16 instances are in the tests below).
if [ "${FP16:-1}" = 1 ] && phase 60 "gpt2-124m fp16"; then
  log "fp16: gpt2-124m, $FP16_STEPS steps of 4 x $SEQ tokens, dynamic loss scaling"
  if train fp16 gpt2-124m $(($(left) / 3)) --set run.device="$DEVICE" --set train.precision=fp16 \
      --set model.seq_len="$SEQ" --set train.micro_batch=4 --set train.global_batch=4 \
      --set train.steps="$FP16_STEPS" --set train.warmup_steps=2 --set train.log_every=1 \
      --set checkpoint.at_end=false; then
    python3 - "$W/fp16/metrics.jsonl" 2>&1 <<'PY' | tee -a "$OUT/summary.txt"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
applied = [r for r in rows if not r.get("overflow")]
assert all(isinstance(r["loss"], float) and math.isfinite(r["loss"]) for r in rows), rows
assert applied[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
print(f"== fp16: losses {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, loss scale "
      f"{rows[-1]['loss_scale']:g}, {rows[-1]['overflows']} overflow(s), "
      f"{rows[-1]['tokens_per_s']:.0f} tokens/s")
PY
    [ "${PIPESTATUS[0]}" = 0 ] || failed+=("fp16")
  else
    tail -20 "$OUT/fp16.log"
    failed+=("fp16 (the run failed)")
  fi
fi

# 2c. Offload on the device: the host's AdamW over the state in host
# memory, gradients down and weights up by block. The update is bit for
# bit the device's; the rest of the step is the same kernels on the same
# data, so the losses match to the GPU's run-to-run reproducibility
# (1e-5 relative: far below what a wrong update moves in 15 steps).
if [ "${OFFLOAD:-1}" = 1 ] && [ "${BENCH:-1}" = 1 ] && phase 60 "offload host"; then
  spec=${MODELS##* }
  model=${spec%%:*} mb=${spec##*:}
  log "offload: $model as benchmarked, with [train] offload = \"host\""
  if [ -f "$OUT/$model.metrics.jsonl" ] &&
     train offload "$model" $(($(left) / 3)) --set run.device="$DEVICE" \
       --set train.precision="$PRECISION" --set model.seq_len="$SEQ" --set train.micro_batch="$mb" \
       --set train.global_batch="$mb" --set train.steps="$STEPS" --set train.warmup_steps=2 \
       --set train.log_every="$LOG_EVERY" --set checkpoint.at_end=false --set train.offload=host; then
    python3 - "$OUT/$model.metrics.jsonl" "$W/offload/metrics.jsonl" 2>&1 <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if '"tokens_per_s"' in l]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert [r["step"] for r in a] == [r["step"] for r in b] and b, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
assert worst <= 1e-5, f"offload host: losses differ from none's by {worst:.2e} relative"
print(f"== offload host: {len(b)} logged steps within {worst:.1e} of none's; tokens/s "
      f"{b[-1]['tokens_per_s']:.0f} against {a[-1]['tokens_per_s']:.0f} "
      f"({b[-1]['tokens_per_s'] / a[-1]['tokens_per_s']:.2f}x), step {b[-1]['step_ms']:.1f} ms")
PY
    [ "${PIPESTATUS[0]}" = 0 ] || failed+=("offload host")
    grep -E "^offload:|^  rank 0 " "$OUT/offload.log" | tee -a "$OUT/summary.txt"
  else
    tail -20 "$OUT/offload.log" 2>/dev/null
    failed+=("offload host (the run failed)")
  fi
fi

# 3. The GPU tests.
if [ "${TESTS:-1}" = 1 ] && phase 120 "tests"; then
  log "tests: ctest -L gpu"
  timeout $(($(left) * 3 / 4)) ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 240 \
    >"$OUT/gpu-tests.log" 2>&1 || failed+=("ctest -L gpu")
  grep -E "Test +#|tests passed|Error|error" "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"
  total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$OUT/gpu-tests.log")
  skipped=$(grep -c "(Skipped)" "$OUT/gpu-tests.log" || true)
  if [ -z "$total" ] || [ "$total" = 0 ] || [ "$skipped" -ge "$total" ]; then
    log "tests: every GPU test skipped or none ran ($skipped of ${total:-0})"
    failed+=("ctest -L gpu (nothing ran)")
  fi
  # With two or more GPUs, NCCL's point-to-point paths too (ctest runs the
  # communicator test on one rank; ranks sharing one GPU cannot use NCCL).
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${ngpu:-0}" -ge 2 ] && phase 60 "NCCL on $ngpu GPUs"; then
    timeout 60 mpirun -np "$ngpu" "$BUILD/tests/mpiformer_gpu_nccl_test" >"$OUT/nccl-$ngpu.log" 2>&1
    rc=$?
    log "NCCL communicator on $ngpu GPUs: $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)")"
    [ $rc = 0 ] || failed+=("NCCL on $ngpu GPUs")
  fi
fi

# 3b. The Llama family on the device against the host, at llama-160m's
# shapes with grouped-query attention (4 kv heads for 12 query heads), on
# the sample corpus's bytes: RMSNorm, rotary positions, SwiGLU and GQA
# attention at real sizes (the GPU tests run them at small ones).
if [ "${COMPARE:-1}" = 1 ] && phase 90 "llama-160m: $DEVICE fp32 against the host"; then
  "$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 --output "$W/data/tinyshakespeare_byte.h5" \
    inputs/tinyshakespeare.txt >>"$OUT/prep.log" 2>&1 || failed+=("llama data")
  compare_on llama-160m llama-160m --set model.n_kv_head=4
fi

# 3c. A Mixture of Experts on the device against the host: llama-160m's
# MLPs as 8 experts of a quarter of their width, top 2, with the default
# capacity (some assignments dropped): the router, dispatch and combine
# kernels and the experts' GEMMs on their rows at real sizes, and the
# one wait per sparse layer for the experts' row counts.
if [ "${COMPARE:-1}" = 1 ] && phase 90 "llama-160m MoE: $DEVICE fp32 against the host"; then
  compare_on llama-160m-moe llama-160m --set model.n_kv_head=4 --set model.experts=8 --set model.top_k=2 \
    --set model.ffn_hidden=512
fi

# 4. compute-sanitizer: the CPU emulation (tests/emulation) runs threads in
# a fixed order, so it cannot see data races: racecheck (shared memory) and
# memcheck (out-of-bounds, misaligned) look where the kernels really run.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ "${TESTS:-1}" = 1 ] && [ -n "$sanitizer" ]; then
  # Our kernels only: cuBLASLt's (sm90_xmma*, nvjet*, cutlass) give false
  # positives under the sanitizer and are not ours to fix.
  exclude=()
  if "$sanitizer" --help 2>/dev/null | grep -q -- --kernel-name-exclude; then
    for k in sm90_xmma nvjet cutlass; do exclude+=(--kernel-name-exclude "kns=$k"); done
  fi
  for tool in memcheck racecheck; do
    phase 100 "compute-sanitizer $tool" || continue
    timeout 90 "$sanitizer" --tool "$tool" --error-exitcode 9 "${exclude[@]}" \
      "$BUILD/tests/mpiformer_gpu_kernels_test" >"$OUT/sanitizer-$tool.log" 2>&1
    rc=$?
    if grep -q "Device not supported" "$OUT/sanitizer-$tool.log"; then
      # Sandboxed runtimes refuse the sanitizer's debugger interface: no
      # verdict either way, so the check is skipped, not failed.
      log "compute-sanitizer $tool on gpu.kernels: SKIPPED (device not supported by the sanitizer here)"
      continue
    fi
    log "compute-sanitizer $tool on gpu.kernels: $([ $rc = 0 ] && echo clean || echo "FAILED ($rc)")"
    [ $rc = 0 ] || failed+=("compute-sanitizer $tool")
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  log "gpu-check: FAILED or incomplete in ${SECONDS} s: ${failed[*]}"
  exit 1
fi
log "gpu-check: every phase passed in ${SECONDS} s"
