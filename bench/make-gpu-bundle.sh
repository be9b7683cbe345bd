#!/usr/bin/env bash
# Packs the cuda build for a GPU machine that has the NVIDIA driver, CUDA
# (cuBLASLt) and NCCL but none of our other dependencies and no network:
# the binaries, the CTest files of the build tree, Open MPI's launcher and
# plugins, h5dump and h5ls, and every shared library they load that is not glibc, the driver,
# cuBLAS or NCCL (collected with ldd), in one .tar.xz under 64 MiB.
# bench/gpu-check.sh unpacks and uses it.
#   OUT_DIR=.bundle  BUILD=build/cuda
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build/cuda}
OUT_DIR=${OUT_DIR:-.bundle}
if [ ! -x "$BUILD/app/mpiformer" ]; then
  bash .ci/deps.sh
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda
fi
BUILD=$(cd "$BUILD" && pwd)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
P=$STAGE/mpiformer-gpu
mkdir -p "$P/bin" "$P/lib" "$P/build"

# The build tree's executables and CTest files, at their relative paths.
(cd "$BUILD" && find . -path '*/CMakeFiles' -prune -o -type f \
   \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' -o -perm -u+x \) \
   -print) | while read -r f; do
  mkdir -p "$P/build/$(dirname "$f")"
  cp "$BUILD/$f" "$P/build/$f"
done
printf 'BUILD=%s\nSOURCE=%s\nMPIEXEC=%s\n' "$BUILD" "$ROOT" "$(command -v mpiexec)" >"$P/origin"
# The unit tests are listed when ctest runs (gtest's PRE_TEST discovery),
# which needs this machine's CMake modules: list them here, once, and make
# each include script read that list (the bundle's binaries do not change).
(cd "$BUILD" && ctest -N >/dev/null)
find "$P/build" -name '*_include.cmake' | while read -r f; do
  list=${f%_include.cmake}_tests.cmake
  cp "$BUILD/${list#"$P/build/"}" "$list"
  printf 'include("%s")\n' "$BUILD/${list#"$P/build/"}" >"$f"
done

# Open MPI 4 (ORTE): the launcher and daemon, the MCA plugins, PMIx's
# plugins and the help texts, laid out under the prefix OPAL_PREFIX names.
ompi_lib=$(dirname "$(readlink -f "$(command -v orterun)")")/../lib/x86_64-linux-gnu
cp "$(readlink -f "$(command -v orterun)")" "$P/bin/mpirun"
cp "$(readlink -f "$(command -v orted)")" "$P/bin/orted"
# HDF5's tools: the tensor-parallel test reads checkpoints with them.
for t in h5dump h5ls; do cp "$(readlink -f "$(command -v "$t")")" "$P/bin/$t"; done
plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
mkdir -p "$P/lib/x86_64-linux-gnu/openmpi/lib"
cp -a "$plugins" "$P/lib/x86_64-linux-gnu/openmpi/lib/"
[ -d /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix ] && cp -a /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix "$P/pmix"
mkdir -p "$P/share"
cp -a /usr/share/openmpi "$P/share/"
[ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$P/share/"
: "$ompi_lib"

# Every library any of those ELF files loads, except what the GPU machine
# must have (glibc, the CUDA driver, cuBLAS/cuBLASLt, NCCL): those must
# match its kernel and driver, and cuBLASLt + NCCL are 750 MB.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil\.so|libresolv|libcuda\.so|libcublas|libnccl)'
find "$P" -type f | while read -r f; do
  file -b "$f" | grep -q ELF || continue
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  [ -e "$P/lib/$name" ] || cp -L "$path" "$P/lib/$name"
done

# Every carried ELF file finds the carried libraries through its own
# RUNPATH ($ORIGIN-relative), never through LD_LIBRARY_PATH: the GPU
# machine's own tools (python3, ctest, compute-sanitizer) must keep loading
# their own, newer libstdc++, zlib or curl. The CUDA toolkit's usual folders
# follow, for cuBLASLt and NCCL; gpu-check.sh adds other places (pip's
# nvidia-* wheels) by LD_LIBRARY_PATH, folders that hold only those.
find "$P" -type f | while read -r f; do
  file -b "$f" | grep -q ELF || continue
  rel=$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
        "$P/lib" "$(dirname "$f")")
  patchelf --set-rpath "\$ORIGIN/$rel:/usr/local/cuda/lib64:/usr/local/cuda/lib" "$f"
done

# The newest glibc symbol version anything needs: the GPU machine's glibc
# must be at least this.
need=$(find "$P" -type f -exec sh -c 'file -b "$1" | grep -q ELF && objdump -T "$1" 2>/dev/null' _ {} \; |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)
echo "$need" >"$P/glibc-needed"
mkdir -p "$OUT_DIR"
# xz on every core (blocks compressed apart: a little larger, twice as fast on two).
XZ_OPT=${XZ_OPT:--T0} tar -C "$STAGE" -cJf "$OUT_DIR/mpiformer-gpu.tar.xz" mpiformer-gpu
size=$(du -m "$OUT_DIR/mpiformer-gpu.tar.xz" | cut -f1)
echo "bundle: $OUT_DIR/mpiformer-gpu.tar.xz, ${size} MiB packed, $(du -sm "$P" | cut -f1) MiB unpacked; needs $need+, cuBLASLt 13, NCCL 2 on the GPU machine"
[ "$size" -le 64 ] || { echo "bundle is over 64 MiB" >&2; exit 1; }
