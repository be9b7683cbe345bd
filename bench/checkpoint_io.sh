#!/usr/bin/env bash
# Checkpoint save/load bandwidth of the gpt2-124m shape (parameters and both
# AdamW moments, about 1.5 GB) at 1, 2 and 4 ranks, against dd writing and
# reading the same number of bytes to the same directory in the same run.
# Both sides are fsynced before they count as written. Reads come from the
# page cache on both sides (no root-free way to drop it): compare the rows
# with each other, not with the disk's datasheet.
#   PRESET=cpu  DIR=bench-out/ckpt
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-cpu}
DIR=${DIR:-bench-out/ckpt}
mkdir -p "$DIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
B=build/$PRESET/bench/mpiformer_bench_checkpoint
echo "== $(date -u +%F), $(df -h "$DIR" | tail -1 | awk '{print $1}') ($(stat -f -c %T "$DIR"))"
mb=$(mpirun -np 1 "$B" inputs/gpt2-124m.toml "$DIR" | sed -n 's/.*checkpoint \([0-9]*\) MB.*/\1/p')
# dd before and after the saves: the page cache's dirty-page throttling makes
# a write's speed depend on what was written just before it.
dd_once() {
  local t0 t1 t2
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$DIR/dd.bin" bs=1M count="$mb" conv=fsync status=none
  t1=$(date +%s.%N)
  dd if="$DIR/dd.bin" of=/dev/null bs=1M status=none
  t2=$(date +%s.%N)
  rm -f "$DIR/dd.bin"
  awk -v a="$t0" -v b="$t1" -v c="$t2" -v mb="$mb" -v w="$1" \
    'BEGIN { printf "dd (%s) %d MB: write %.2f s, %.0f MB/s | read %.2f s, %.0f MB/s\n", w, mb, b-a, mb/(b-a), c-b, mb/(c-b) }'
}
dd_once before
for np in 1 2 4; do
  mpirun --oversubscribe -np $np "$B" inputs/gpt2-124m.toml "$DIR"
done
dd_once after
