#!/usr/bin/env bash
# mpiformer calibrate on a GPU (before, it measured the host and wrote
# device = "cpu" on a GPU node): 2 ranks (on one GPU they share it, and the
# links go through MPI in host memory, as such a run's would) write a
# machine file that says cuda, holds the GPU's memory and a bf16 GEMM peak
# far above any host's, and rows measured on the device; plan reads it for
# a bf16 deck. No rate is asserted beyond "a GPU's" (benchmarks measure).
# Under MPIFORMER_REHEARSE_GPU=1 (CI, no GPU) the same steps run on the
# host back end (--device cpu, fp32), with the host's bounds.
source "$(dirname "$0")/../e2e/lib.sh"
if [ "${MPIFORMER_REHEARSE_GPU:-}" = 1 ]; then
  device=cpu precision=fp32 header="host back end, fp32" min_gib=0.1 min_tflops=0.001
else
  "$GPU_PROBE" || exit $?
  device=cuda precision=bf16 header="GPUs, bf16 rates" min_gib=4 min_tflops=20
fi
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
run_mpi 2 calibrate "$DECK" --seconds 0.003 --name "gpu machine" --device "$device" \
  -o machine.toml >cal.log 2>&1 || { cat cal.log; fail "calibrate"; }
cat cal.log
grep -q "^device = \"$device\"" machine.toml || fail "machine.toml does not say $device"
grep -q "$header" machine.toml || fail "machine.toml does not name its precision ($header)"
grep -q "^precision = \"$precision\"" machine.toml || fail "machine.toml has no [compute] precision = \"$precision\""
python3 - machine.toml "$min_gib" "$min_tflops" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
min_gib, min_tflops = float(sys.argv[2]), float(sys.argv[3])
num = lambda key: float(re.search(rf"^{key} = ([0-9.e+-]+)", text, re.M).group(1))
assert num("memory_gib") > min_gib, num("memory_gib")        # a GPU's memory, not a host share
assert num("peak_tflops") > min_tflops, num("peak_tflops")    # bf16 tensor cores, not a CPU
for section in ("[[compute.matmul]]", "[[compute.attention]]", "[[compute.kernels]]", "[intra]"):
    assert section in text, section
print(f"calibrate: {num('memory_gib'):.1f} GiB, peak {num('peak_tflops'):.3g} TFLOP/s")
PY
"$MPIFORMER" plan "$DECK" --set data.train='"data/tinyshakespeare_byte.h5"' \
  --set train.precision="$precision" --machine machine.toml --ranks 1 >plan.txt ||
  { cat plan.txt; fail "plan could not use the machine file"; }
echo "ok: a $device machine file, planned with"
