#!/usr/bin/env bash
# Workstation launcher: `jobs/local.sh DECK [mpiformer train arguments...]`.
# Runs mpirun with as many ranks as the deck's dp x pp (or NP), adds
# --oversubscribe when that is more than the cores (or OVERSUBSCRIBE=1), and
# the root flags only when run as root. With GPUs (nvidia-smi lists them),
# each rank sees one: GPU (node-local rank mod GPUs), by CUDA_VISIBLE_DEVICES.
#   NP=  OVERSUBSCRIBE=0  MPIFORMER=build/cpu/app/mpiformer
set -euo pipefail
DECK=${1:?usage: jobs/local.sh DECK [--set section.key=value]...}
shift
MPIFORMER=${MPIFORMER:-$(dirname "$0")/../build/cpu/app/mpiformer}

# dp and pp: a --set on the command line wins over the deck.
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
NP=${NP:-$((dp * pp))}

launch=(mpirun -np "$NP")
[ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
if [ "${OVERSUBSCRIBE:-0}" = 1 ] || [ "$NP" -gt "$(nproc)" ]; then launch+=(--oversubscribe); fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
bind=()
if [ "${gpus:-0}" -gt 0 ]; then
  # shellcheck disable=SC2016  # expanded by each rank's shell, not here
  bind=(bash -c 'export CUDA_VISIBLE_DEVICES=$((OMPI_COMM_WORLD_LOCAL_RANK % '"$gpus"')); exec "$@"' bind)
fi
cmd=("${launch[@]}" "${bind[@]+"${bind[@]}"}" "$MPIFORMER" train "$DECK" "$@")
echo "mpiformer $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown): ${cmd[*]}"
exec "${cmd[@]}"
