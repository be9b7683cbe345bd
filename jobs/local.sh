#!/usr/bin/env bash
# Workstation launcher: `jobs/local.sh DECK [mpiformer train arguments...]`.
# Runs mpirun with as many ranks as the deck's dp x pp x tp x cp (or NP), adds
# --oversubscribe when that is more than the cores (or OVERSUBSCRIBE=1), and
# the root flags only when run as root. With a cuda build every rank sees
# every GPU and takes GPU (node-local rank mod GPUs) itself: keeping them
# all visible lets NCCL use NVLink and peer-to-peer copies between ranks.
# Ctrl-C, SIGTERM or SIGHUP to this script checkpoints and exits 75 (see
# forward-signals.sh); mpirun's own handling of them would not.
# A launch that fails (a rank killed or crashed, the watchdog ending a stuck
# rank) is restarted from the last checkpoint (see recovery.sh:
# MAX_FAILURE_RESTARTS, RESTART_BACKOFF_S); the exit status is 0 only when
# the run reached its last step.
#   NP=  OVERSUBSCRIBE=0  MPIFORMER=build/cpu/app/mpiformer
# NCCL_*, UCX_* and OMPI_MCA_* variables reach every rank (one node: the
# ranks inherit this environment); see jobs/TUNING.md.
set -euo pipefail
DECK=${1:?usage: jobs/local.sh DECK [--set section.key=value]...}
shift
jobs=$(dirname "$0")
MPIFORMER=${MPIFORMER:-$jobs/../build/cpu/app/mpiformer}
source "$jobs/forward-signals.sh"
source "$jobs/recovery.sh"
[ -r "$DECK" ] || { echo "jobs/local.sh: cannot read the deck $DECK" >&2; exit 2; }

dp=$(deck_value parallel dp 1 "$DECK" "$@")
pp=$(deck_value parallel pp 1 "$DECK" "$@")
tp=$(deck_value parallel tp 1 "$DECK" "$@")
cp=$(deck_value parallel cp 1 "$DECK" "$@")
NP=${NP:-$((dp * pp * tp * cp))}
RUN_DIR=$(deck_value run dir runs/default "$DECK" "$@")

launch=(mpirun -np "$NP")
[ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
if [ "${OVERSUBSCRIBE:-0}" = 1 ] || [ "$NP" -gt "$(nproc)" ]; then launch+=(--oversubscribe); fi
cmd=("${launch[@]}" "$MPIFORMER" train "$DECK" "$@")
echo "mpiformer $(git -C "$jobs" rev-parse --short HEAD 2>/dev/null || echo unknown): ${cmd[*]}"
run_until_done "$RUN_DIR" "failed watchdog"
exit "$rc"
