#!/usr/bin/env bash
# [train] offload: AdamW's moments (and in bf16 the float masters) in host
# memory or in files (nvme), streamed through each step in blocks.
# (1) Bit for bit: every step's loss, grad norm and validation loss, and
#     every final tensor (h5diff), equal offload = "none"'s exactly over
#     dp, pp, tp, zero 0-3, accumulation and fp32 and bf16. Small blocks (20 KiB of each
#     moment, about 5000 elements) cut the tiny model's state into ~160
#     blocks, so tensors and AdamW's chunks cross block boundaries and the
#     ring of read-ahead and write-behind buffers turns over many times.
# (2) Checkpoints across settings: every nvme run's final checkpoint holds
#     the same moments as none's, and one written under none resumes under
#     nvme (over stale files a dead run left: replaced, not read) to the
#     straight run's numbers exactly.
# (3) Faults and bad input, each on every rank with the file or key named:
#     a missing offload_dir, nvme without one, one without room or
#     read-only (tmpfs mounts; skipped where they cannot be made), a second
#     run in the same place, a write that
#     fails mid-run (exit 74, the last checkpoint resumes and finishes
#     exactly), and the files removed when a run ends, by a signal too.
# (4) The buffered path of file systems without direct I/O, exactly.
source "$(dirname "$0")/lib.sh"
prep_sample_data
DECK="$SOURCE_DIR/inputs/tiny.toml"
# shellcheck disable=SC2206  # SHORT_SEQ's words are the arguments
common=(--set train.steps=6 --set train.log_every=1 --set train.eval_every=3
        --set train.global_batch=16 --set train.micro_batch=4 --set train.eval_batches=1
        --set train.offload_block_mb=0.02 $SHORT_SEQ)
mkdir -p scratch

train() {  # dir dp pp tp zero offload [extra...]
  local dir=$1 dp=$2 pp=$3 tp=$4 zero=$5 where=$6
  shift 6
  run_mpi $((dp * pp * tp)) train "$DECK" "${common[@]}" --set parallel.dp="$dp" \
    --set parallel.pp="$pp" --set parallel.tp="$tp" --set parallel.zero="$zero" \
    --set train.offload="$where" --set train.offload_dir=scratch --set run.dir="$dir" "$@" \
    >"$dir.log" 2>&1 || { cat "$dir.log"; fail "$dir failed"; }
}
same_tensors() {  # a.h5 b.h5 label
  for g in /model /optim; do
    h5diff "$1" "$2" "$g" "$g" >/dev/null || fail "$3: tensors under $g differ"
  done
}
no_files_left() {  # label
  if ls scratch/mpiformer-offload.* >/dev/null 2>&1; then
    ls -la scratch
    fail "$1: offload files left behind"
  fi
}

# (1) Placement changes no bit. dp 2 with two micro-batches a step
# (accumulation), zero 0 and 3, pp 2 (the tied embedding's two copies),
# tp 2 with zero 1.
for lay in "2 1 1 0" "2 1 1 3" "1 2 1 2" "1 1 2 1"; do
  set -- $lay
  ref="none_$1$2$3_z$4"
  train "$ref" "$@" none
  for where in nvme host; do
    # host offload is the GPU's placement; on the host back end it runs
    # the same streamed update: checked on one layout.
    [ "$where" = host ] && [ "$lay" != "2 1 1 3" ] && continue
    got="${where}_$1$2$3_z$4"
    train "$got" "$@" "$where"
    compare "$ref/metrics.jsonl" "$got/metrics.jsonl" 0 "offload $where, dp $1 pp $2 tp $3 zero $4"
    same_tensors "$ref/checkpoints/step_00000006.h5" "$got/checkpoints/step_00000006.h5" \
      "offload $where, dp $1 pp $2 tp $3 zero $4"
    no_files_left "$got"
  done
done
grep -q "^offload: AdamW's moments .* in scratch (.*I/O.*), streamed in blocks of 0.0 MB" \
  nvme_211_z0.log || { grep offload nvme_211_z0.log; fail "no offload line in the summary"; }

# bf16: the float masters leave with the moments (the back end keeps the
# 16-bit copy only), at zero 0 (the stage without masters), zero 3 (the
# shard's copy gathered from them) and, in fp16 (loss scaling: the update
# unscales), pp 2 at zero 2 (the tied embedding's two shards); the same
# bits as none. Then none's
# zero-0 checkpoint at step 3 resumed under nvme: the masters and moments
# restored into their files' views, exactly.
for lay in "2 1 1 0 bf16" "2 1 1 3 bf16" "1 2 1 2 fp16"; do
  set -- $lay
  prec=$5
  set -- "$1" "$2" "$3" "$4"
  ref="${prec}_none_z$4"
  train "$ref" "$@" none --set train.precision="$prec"
  for where in nvme host; do
    [ "$where" = host ] && [ "$4" != 0 ] && continue
    got="${prec}_${where}_z$4"
    train "$got" "$@" "$where" --set train.precision="$prec"
    compare "$ref/metrics.jsonl" "$got/metrics.jsonl" 0 "$prec offload $where, dp $1 pp $2 zero $4"
    same_tensors "$ref/checkpoints/step_00000006.h5" "$got/checkpoints/step_00000006.h5" \
      "$prec offload $where, dp $1 pp $2 zero $4"
    no_files_left "$got"
  done
done
grep -q "^offload: AdamW's moments and float masters .* in scratch" bf16_nvme_z0.log ||
  { grep offload bf16_nvme_z0.log; fail "bf16: the summary does not say the masters left"; }
train bf16_seg 2 1 1 0 none --set train.precision=bf16 --set train.stop_at=3
train bf16_seg 2 1 1 0 nvme --set train.precision=bf16
compare bf16_none_z0/metrics.jsonl bf16_seg/metrics.jsonl 0 "bf16 zero 0: none step 3 -> nvme"
same_tensors bf16_none_z0/checkpoints/step_00000006.h5 bf16_seg/checkpoints/step_00000006.h5 \
  "bf16 zero 0: none step 3 -> nvme"
no_files_left bf16_seg

# (2) A zero-3 checkpoint written under none resumed under nvme (each
# rank's rows read into its files), over files a dead run left (replaced,
# not read; a dead larger run's other ranks' removed: no_files_left), exactly; the failed-write case below resumes zero 0's (the
# whole stage gathered into them). (Every nvme run above
# already saved its offloaded moments, which same_tensors compared.)
train seg_none 2 1 1 3 none --set train.stop_at=3
printf 'left by a dead run' >scratch/mpiformer-offload.rank0.adam_m
printf 'left by a dead run' >scratch/mpiformer-offload.rank1.adam_v
# ... and of ranks this run does not have (a dead run of 4): removed.
printf 'left by a dead run' >scratch/mpiformer-offload.rank2.adam_m
printf 'left by a dead run' >scratch/mpiformer-offload.rank3.adam_v
train seg_none 2 1 1 3 nvme
grep -q "files an earlier run left there were replaced" seg_none.log || fail "stale files not reported"
compare none_211_z3/metrics.jsonl seg_none/metrics.jsonl 0 "zero 3: none step 3 -> nvme, over stale files"
same_tensors none_211_z3/checkpoints/step_00000006.h5 seg_none/checkpoints/step_00000006.h5 \
  "zero 3: none step 3 -> nvme"
no_files_left seg_none

# (3) Faults and bad input.
refused() {  # label expected-text run-args...
  local label=$1 want=$2 rc=0
  shift 2
  run_mpi 2 train "$DECK" "${common[@]}" --set parallel.dp=2 --set run.dir="bad_$label" "$@" \
    >"bad_$label.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "bad_$label.log"; fail "$label: exit $rc, not 2"; }
  grep -qF -- "$want" "bad_$label.log" || { cat "bad_$label.log"; fail "$label: no \"$want\""; }
  [ ! -e "bad_$label/checkpoints/latest" ] || fail "$label: a checkpoint was written"
  echo "ok: $label refused: $(grep -m1 -F -- "$want" "bad_$label.log")"
}
refused missing_dir "nowhere: [train] offload_dir: does not exist" \
  --set train.offload=nvme --set train.offload_dir=nowhere
refused no_dir "[train] offload_dir: needed with [train] offload = \"nvme\"" \
  --set train.offload=nvme
# A second run given the same offload_dir while the first holds it; the
# first, stopped by a signal, removes its files.
run_mpi 2 train "$DECK" "${common[@]}" --set parallel.dp=2 --set train.steps=100000 \
  --set train.eval_every=0 --set checkpoint.at_end=false --set train.offload=nvme \
  --set train.offload_dir=scratch --set run.dir=holder >holder.log 2>&1 &
holder=$!
for _ in $(seq 300); do
  grep -qE "^step +2/" holder.log && break
  kill -0 "$holder" 2>/dev/null || { cat holder.log; fail "the first run ended early"; }
  sleep 0.2
done
grep -qE "^step +2/" holder.log || { cat holder.log; fail "the first run did not reach step 2"; }
refused shared "another job is using this directory" --set train.offload=nvme \
  --set train.offload_dir=scratch
# To the ranks, as Slurm signals them (mpirun's own SIGTERM kills them).
pkill -TERM -f "^$MPIFORMER train .*run.dir=holder"
rc=0
wait "$holder" || rc=$?
[ "$rc" -eq 75 ] || { cat holder.log; fail "the holder's SIGTERM: exit $rc, not 75"; }
no_files_left "a run stopped by SIGTERM"

# A write that fails mid-run: exit 74 on every rank, the file named; step
# 2's checkpoint is intact and the run resumes from it to the same end.
rc=0
MPIFORMER_FAULT_OFFLOAD_WRITE=500 run_mpi 2 train "$DECK" "${common[@]}" --set parallel.dp=2 \
  --set train.offload=nvme --set train.offload_dir=scratch \
  --set checkpoint.every=1 --set run.dir=failing >failing.log 2>&1 || rc=$?
[ "$rc" -eq 74 ] || { cat failing.log; fail "a failed offload write: exit $rc, not 74"; }
grep -q "write of scratch/mpiformer-offload.rank0.adam_[mv] at byte [0-9]* failed" failing.log ||
  { cat failing.log; fail "the failed write is not named"; }
last=$(head -1 failing/checkpoints/latest)
echo "ok: the failed write ended the run at exit 74; latest is $last"
train failing 2 1 1 0 nvme --set checkpoint.every=1
grep -q "resumed from .*step_0000000[1-5].h5" failing.log || { cat failing.log; fail "no resume"; }
compare none_211_z0/metrics.jsonl failing/metrics.jsonl 0 "resumed after a failed offload write"
same_tensors none_211_z0/checkpoints/step_00000006.h5 failing/checkpoints/step_00000006.h5 \
  "resumed after a failed offload write"
no_files_left "after the resumed run"

# The buffered path (file systems without direct I/O; which ones lack it
# changes with the kernel, so the test hook takes it here), exactly.
MPIFORMER_OFFLOAD_BUFFERED=1 train buffered_211_z0 2 1 1 0 nvme
grep -q "^offload: .*(buffered I/O" buffered_211_z0.log ||
  { grep offload buffered_211_z0.log; fail "not the buffered path"; }
compare none_211_z0/metrics.jsonl buffered_211_z0/metrics.jsonl 0 "offload nvme, buffered I/O"
no_files_left buffered_211_z0

# Without room, and read-only: small tmpfs mounts.
mkdir -p small ro
if mount -t tmpfs -o size=1M tmpfs small 2>mount.err && mount -t tmpfs -o ro,size=1M tmpfs ro; then
  trap 'umount "$WORK/small" "$WORK/ro" 2>/dev/null; rm -rf "$WORK"' EXIT
  refused no_room "MB needed" --set train.offload=nvme --set train.offload_dir=small
  refused read_only "[train] offload_dir: not writable" --set train.offload=nvme \
    --set train.offload_dir=ro
else
  echo "note: no tmpfs here ($(cat mount.err)): the full and read-only cases are not run"
fi
echo "offload: all checks passed"
