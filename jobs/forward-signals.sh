# Sourced by the launchers (local.sh, train.sbatch): `run_forwarding CMD...`
# runs CMD (mpirun or srun) and turns SIGINT/SIGTERM/SIGUSR1 sent to this
# script into SIGUSR1 for CMD, which mpirun and srun both pass on to every
# rank: mpiformer then checkpoints after an agreed step and exits 75.
#
# Why not let CMD see SIGINT/SIGTERM itself: Open MPI's mpirun forwards
# SIGTERM and then kills the ranks after a grace shorter than a large
# checkpoint's save, and exits 1 whatever the ranks said. CMD runs in its own
# session so Ctrl-C at the terminal reaches only this script, which forwards
# it as SIGUSR1. A second Ctrl-C/SIGTERM while the checkpoint is written is
# forwarded the same way (it changes nothing); SIGKILL remains the way out.
# Sets `rc` to CMD's exit status.
run_forwarding() {
  local pid=
  forward() {
    echo "== $1 received: asking mpiformer to checkpoint and stop (SIGUSR1 to the ranks)" >&2
    [ -n "$pid" ] && kill -USR1 "$pid" 2>/dev/null
  }
  trap 'forward SIGINT' INT
  trap 'forward SIGTERM' TERM
  trap 'forward SIGUSR1' USR1
  # A trap runs only when the shell gets control back, so CMD runs in the
  # background and the shell waits for it.
  setsid "$@" &
  pid=$!
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break  # still running: a trap interrupted wait
  done
  trap - INT TERM USR1
}
