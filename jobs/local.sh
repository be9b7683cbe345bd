#!/usr/bin/env bash
# Workstation launcher: `jobs/local.sh DECK [mpiformer train arguments...]`.
# Runs mpirun with as many ranks as the deck's dp x pp x tp (or NP), adds
# --oversubscribe when that is more than the cores (or OVERSUBSCRIBE=1), and
# the root flags only when run as root. With a cuda build every rank sees
# every GPU and takes GPU (node-local rank mod GPUs) itself: keeping them
# all visible lets NCCL use NVLink and peer-to-peer copies between ranks.
# Ctrl-C or SIGTERM to this script checkpoints and exits 75 (see
# forward-signals.sh); mpirun's own handling of them would not.
#   NP=  OVERSUBSCRIBE=0  MPIFORMER=build/cpu/app/mpiformer
set -euo pipefail
DECK=${1:?usage: jobs/local.sh DECK [--set section.key=value]...}
shift
MPIFORMER=${MPIFORMER:-$(dirname "$0")/../build/cpu/app/mpiformer}

# dp, pp and tp: a --set on the command line wins over the deck.
layout() {
  local key=$1 v
  v=$(printf '%s\n' "$@" | sed -n "s/^parallel\.$key=\([0-9]*\)$/\1/p" | tail -1)
  [ -n "$v" ] || v=$(awk -v k="$key" '/^\[/{s=$0} s=="[parallel]" && $1==k {print $3}' "$DECK" | tail -1)
  echo "${v:-1}"
}
sets=()
prev=
for a in "$@"; do [ "$prev" = "--set" ] && sets+=("$a"); prev=$a; done
dp=$(layout dp "${sets[@]+"${sets[@]}"}")
pp=$(layout pp "${sets[@]+"${sets[@]}"}")
tp=$(layout tp "${sets[@]+"${sets[@]}"}")
NP=${NP:-$((dp * pp * tp))}

launch=(mpirun -np "$NP")
[ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
if [ "${OVERSUBSCRIBE:-0}" = 1 ] || [ "$NP" -gt "$(nproc)" ]; then launch+=(--oversubscribe); fi
cmd=("${launch[@]}" "$MPIFORMER" train "$DECK" "$@")
echo "mpiformer $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown): ${cmd[*]}"
# Ctrl-C or SIGTERM here: the ranks checkpoint and the exit code is 75.
source "$(dirname "$0")/forward-signals.sh"
run_forwarding "${cmd[@]}"
exit "$rc"
