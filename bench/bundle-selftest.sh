#!/usr/bin/env bash
# Proves the GPU bundle needs nothing of this machine's Open MPI, HDF5,
# OpenBLAS, Kokkos and the rest: in a private mount namespace (root) every
# system copy of a carried library, Open MPI's launcher, plugins and help
# texts, and the build tree are hidden, then the carried binaries unpack,
# launch 2 ranks with the carried mpirun and train the tiny deck on the host
# back end for 3 steps. A GPU is not needed (the GPU tests skip).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bundle=$ROOT/.bundle/mpiformer-gpu.tar.xz
[ -f "$bundle" ] || bash "$ROOT/bench/make-gpu-bundle.sh"
U=$(mktemp -d)
trap 'rm -rf "$U"' EXIT
tar -C "$U" -xJf "$bundle"
# The inner script is a file: mpirun would read a script fed on stdin.
cat >"$U/inner.sh" <<'INNER'
set -euo pipefail
ROOT=$1 U=$2 P=$2/mpiformer-gpu
# The system's own tools (bash, grep, sed, tar...) keep the libraries they
# load; every other carried library's system copy is hidden by binding
# /dev/null over it, from one process (the mounts would break `mount`).
keep=$(for t in bash grep sed mkdir cat readlink mktemp tar xz rm cp env python3; do
         { ldd "$(command -v $t)" 2>/dev/null || true; } | awk '$2 == "=>" { print $1 }'; done | sort -u)
targets=()
for lib in "$P"/lib/*.so*; do
  name=$(basename "$lib")
  grep -qx "$name" <<<"$keep" && continue
  for sys in /usr/lib/x86_64-linux-gnu/$name /usr/lib/x86_64-linux-gnu/*/$name; do
    [ -e "$sys" ] && targets+=("/dev/null=$(readlink -f "$sys")")
  done
done
empty=$(mktemp -d)
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
         "$ROOT/build"; do
  [ -d "$d" ] && targets+=("$empty=$d")
done
for b in orterun orted; do targets+=("/dev/null=$(readlink -f "$(command -v $b)")"); done
python3 - "${targets[@]}" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND = 4096
for t in sys.argv[1:]:
    src, dst = t.split("=", 1)
    if libc.mount(src.encode(), dst.encode(), None, MS_BIND, None) != 0:
        raise SystemExit(f"mount {src} on {dst}: {os.strerror(ctypes.get_errno())}")
PY
kept=$(for lib in "$P"/lib/*.so*; do
         if grep -qx "$(basename "$lib")" <<<"$keep"; then basename "$lib"; fi; done | tr '\n' ' ')
echo "hidden: ${#targets[@]} system files and directories; still visible (the shell tools load them): $kept"
cat >"$U/env.sh" <<ENV
export OPAL_PREFIX=$P PATH=$P/bin:\$PATH
export OMPI_MCA_mca_base_component_path=$P/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$P/pmix
ENV
source "$U/env.sh"
# No LD_LIBRARY_PATH: the carried binaries find the carried libraries by
# their RUNPATH, and the machine's own programs never see them.
unset LD_LIBRARY_PATH
if ldd "$(readlink -f "$(command -v python3)")" 2>/dev/null | grep "$P" >/dev/null; then  # all read: no SIGPIPE under pipefail
  echo "python3 loads a carried library" >&2
  exit 1
fi
if ldd "$P/build/app/mpiformer" | grep "=>" | grep -v "$P/" |
   grep -E "libstdc\+\+|libmpi|libhdf5|libopenblas" ; then
  echo "mpiformer loads a system copy of a carried library (above)" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$U"
mkdir -p data
"$P/build/app/mpiformer" prep --tokenizer byte --val-fraction 0.1 \
  --output data/tinyshakespeare_byte.h5 "$ROOT/inputs/tinyshakespeare.txt" >/dev/null
mpirun -np 2 "$P/build/app/mpiformer" train "$ROOT/inputs/tiny.toml" --set run.device=cpu \
  --set parallel.pp=2 --set train.steps=3 --set train.log_every=1 --set checkpoint.resume=never \
  --set run.dir="$U/run" </dev/null | grep -E "^step|^device|checkpoint:"
"$P/build/tests/mpiformer_gpu_probe" || [ $? = 77 ]
echo "bundle self-test: passed"
INNER
unshare -m --propagation private bash "$U/inner.sh" "$ROOT" "$U"
