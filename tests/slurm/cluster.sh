# A one-node Slurm on 127.0.0.1 for the tests, everything under $SLURM_TEST_DIR
# (no /etc changes): munged, slurmctld and slurmd started by us and stopped
# by their PIDs. Sourced; call slurm_up, then slurm_down (or trap it).
# SLURM_NODES=N (N > 1) makes N nodes node1..nodeN, each its own slurmd on
# its own port of this host (Debian's slurmd runs several with -N), so a
# job can lose one node and keep the others.
# Facts this relies on (Debian 12 slurm-wlm 22.05): the host name is not a
# usable node name, so the node is localhost at 127.0.0.1 and slurmd runs
# with -N localhost; no cgroups (linuxproc, task/none); RealMemory kept
# below what `slurmd -C` reports; kill_invalid_depend under
# DependencyParameters; munged's socket directory world-searchable.

slurm_skip_reason() {
  for b in munged slurmctld slurmd sbatch scontrol squeue; do
    command -v "$b" >/dev/null || { echo "$b not installed (apt-get install slurm-wlm munge)"; return; }
  done
  [ "$(id -u)" -eq 0 ] || echo "needs root (SlurmUser=root, as in CI)"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

slurm_start() {
  local d=$SLURM_TEST_DIR
  mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log"
  chmod 755 "$d" "$d/munge"
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$d/munge/munge.key"
  munged --force --key-file="$d/munge/munge.key" --socket="$d/munge/munge.socket" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/seed"
  local mem cpus
  mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mem=$(( ${mem:-2048} / 2 ))
  cpus=$(( $(nproc) < 4 ? 4 : $(nproc) ))  # 4 ranks even on 2 cores
  cat >"$d/slurm.conf" <<CONF
ClusterName=mpiformer-test
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.socket
CryptoType=crypto/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
DependencyParameters=kill_invalid_depend
ReturnToService=2
JobRequeue=1
MinJobAge=600
# A failed step is torn down in seconds, not the default 30 (the restart tests wait for it).
KillWait=5
CONF
  local nodes=localhost n
  if [ "${SLURM_NODES:-1}" -gt 1 ]; then nodes=$(seq -s, -f "node%g" 1 "$SLURM_NODES"); fi
  for n in ${nodes//,/ }; do
    mkdir -p "$d/spool/$n"
    echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$d/slurm.conf"
  done
  echo "PartitionName=test Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >>"$d/slurm.conf"
  export SLURM_CONF=$d/slurm.conf
  slurmctld -c
  for n in ${nodes//,/ }; do slurmd -N "$n"; done
  local i
  for i in $(seq 1 60); do
    if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)$')" -eq "${SLURM_NODES:-1}" ]; then
      return 0
    fi
    sleep 1
  done
  echo "slurm did not come up in 60 s; logs:" >&2
  tail -n 20 "$d"/log/*.log >&2
  sinfo -N 2>&1 | tail -n 5 >&2
  return 1
}

# The test cluster up, or 1. A start that does not come up (seen once in a
# CI run, without its logs, and not since in some 15 starts) is followed by one
# more from nothing: new ports, new state, so a port taken between
# free_port and the daemon's bind cannot fail a test of our scripts.
slurm_up() {
  slurm_start && return 0
  echo "slurm: starting once more, from nothing" >&2
  slurm_down
  rm -rf "${SLURM_TEST_DIR:?}"/{munge,state,spool,log} "$SLURM_TEST_DIR"/*.pid
  slurm_start
}

slurm_down() {
  local d=$SLURM_TEST_DIR f
  for f in "$d"/slurmd-*.pid "$d/slurmctld.pid" "$d/munge/munged.pid"; do
    [ -f "$f" ] && { kill "$(cat "$f")" 2>/dev/null || true; }  # a test may have killed it
  done
  sleep 1
  for f in "$d"/slurmd-*.pid "$d/slurmctld.pid" "$d/munge/munged.pid"; do
    [ -f "$f" ] && { kill -9 "$(cat "$f")" 2>/dev/null || true; }
  done
  slurm_steps_down "$d/slurm.conf"
  return 0
}

# A job still running when its cluster goes down keeps its slurmstepd, and
# what the step runs, after slurmd is gone: one was found 1.5 hours after a
# suite run, ignoring SIGTERM. This cluster's steps (those started under
# its slurm.conf) end here, each with its processes.
slurm_steps_down() {  # SLURM_CONF
  local p
  for p in $(pgrep -x slurmstepd); do
    # grep reads to the end (not -q): under pipefail a tr cut short by an
    # early exit would read as no match.
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -xF "SLURM_CONF=$1" >/dev/null || continue
    kill -9 $(process_tree "$p") 2>/dev/null || true
  done
}
process_tree() {  # PID: it and its descendants
  local c
  echo "$1"
  for c in $(pgrep -P "$1"); do process_tree "$c"; done
}

# job_state ID STATE: whether the job is in STATE now.
job_state() {
  [ "$(scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')" = "$2" ]
}

# wait_job ID STATE... : until the job reaches one of the states (or 300 s).
wait_job() {
  local id=$1 i st
  shift
  for i in $(seq 1 300); do
    st=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    for want in "$@"; do [ "$st" = "$want" ] && return 0; done
    sleep 1
  done
  echo "job $id still $st after 300 s (wanted $*)" >&2
  return 1
}
