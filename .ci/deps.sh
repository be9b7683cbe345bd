#!/usr/bin/env bash
# Installs every Debian package mpiformer needs to build, test and benchmark.
# Idempotent: packages already present are skipped; runs as root or via sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  python3-numpy python3-matplotlib  # tests/e2e/gpt2_numpy.py (a reader of exported weights), jobs/plot-metrics.py
  python3-h5py  # tests/e2e/hostile.sh: foreign HDF5 files as h5py writes them (links, virtual datasets, LZF, user blocks)
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtrilinos-kokkos-dev
  libopenblas-dev libopenblas-openmp-dev  # the OpenMP build: one thread pool with oneDNN and the loops
  libdnnl-dev ocl-icd-opencl-dev  # host bf16 matmuls (oneDNN; its CMake config needs OpenCL's)
  libtoml11-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libxxhash-dev
  zlib1g-dev libzstd-dev zstd  # prep reads gzip and zstd text (zstd: its tests compress with the tool)
  libsentencepiece-dev sentencepiece  # prep --tokenizer sentencepiece (Llama-style tokens); spm_train/spm_encode in its tests
  slurm-wlm munge
  file binutils xz-utils util-linux patchelf  # bench/make-gpu-bundle.sh (RUNPATHs), bench/bundle-selftest.sh
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
