# Sourced by the launchers (local.sh, train.sbatch): `run_forwarding CMD...`
# runs CMD (mpirun or srun) and turns SIGINT/SIGTERM/SIGHUP/SIGUSR1 sent to
# this script into SIGUSR1 for CMD, which mpirun and srun both pass on to
# every rank: mpiformer then checkpoints after an agreed step and exits 75.
# SIGHUP is a closed terminal: the run must not go on without its launcher.
#
# Why not let CMD see SIGINT/SIGTERM itself: Open MPI's mpirun forwards
# SIGTERM and then kills the ranks after a grace shorter than a large
# checkpoint's save, and exits 1 whatever the ranks said. CMD runs in its own
# session so Ctrl-C at the terminal reaches only this script, which forwards
# it as SIGUSR1. A second Ctrl-C/SIGTERM while the checkpoint is written is
# forwarded the same way (it changes nothing). SIGKILL to this script cannot
# be caught: a guard process in a session of its own sees the script gone
# and forwards SIGUSR1 to CMD the same way, so no run goes on without a
# launcher holding its run directory.
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
  trap 'forward SIGHUP' HUP
  # A trap runs only when the shell gets control back, so CMD runs in the
  # background and the shell waits for it.
  setsid "$@" &
  pid=$!
  local guard
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
    kill -0 "$2" 2>/dev/null || exit 0
    echo "== the launcher script (pid $1) is gone: asking mpiformer to checkpoint and stop" >&2
    kill -USR1 "$2"' guard "$$" "$pid" </dev/null &
  guard=$!
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break  # still running: a trap interrupted wait
  done
  kill "$guard" 2>/dev/null || true
  wait "$guard" 2>/dev/null || true
  trap - INT TERM USR1 HUP
}
