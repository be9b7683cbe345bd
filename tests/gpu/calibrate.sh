#!/usr/bin/env bash
# mpiformer calibrate on a GPU (before, it measured the host and wrote
# device = "cpu" on a GPU node): 2 ranks (on one GPU they share it, and the
# links go through MPI in host memory, as such a run's would) write a
# machine file that says cuda, holds the GPU's memory and a bf16 GEMM peak
# far above any host's, and rows measured on the device; plan reads it for
# a bf16 deck. No rate is asserted beyond "a GPU's" (benchmarks measure).
source "$(dirname "$0")/../e2e/lib.sh"
"$GPU_PROBE" || exit $?
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
run_mpi 2 calibrate "$DECK" --seconds 0.003 --name "gpu machine" -o machine.toml >cal.log 2>&1 ||
  { cat cal.log; fail "calibrate"; }
cat cal.log
grep -q '^device = "cuda"' machine.toml || fail "machine.toml does not say cuda"
grep -q "GPUs, bf16 rates" machine.toml || fail "machine.toml does not name its precision"
/usr/bin/python3 - machine.toml <<'PY'
import re, sys
text = open(sys.argv[1]).read()
num = lambda key: float(re.search(rf"^{key} = ([0-9.e+-]+)", text, re.M).group(1))
assert num("memory_gib") > 4, num("memory_gib")        # a GPU's memory, not a host share
assert num("peak_tflops") > 20, num("peak_tflops")      # bf16 tensor cores, not a CPU
for section in ("[[compute.matmul]]", "[[compute.attention]]", "[[compute.kernels]]", "[intra]"):
    assert section in text, section
print(f"calibrate: {num('memory_gib'):.0f} GiB, bf16 peak {num('peak_tflops'):.0f} TFLOP/s")
PY
"$MPIFORMER" plan "$DECK" --set data.train='"data/tinyshakespeare_byte.h5"' --set train.precision=bf16 --machine machine.toml --ranks 1 >plan.txt ||
  { cat plan.txt; fail "plan could not use the GPU machine file"; }
echo "ok: a GPU machine file, planned with"
