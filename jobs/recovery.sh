# Sourced by the launchers (local.sh, train.sbatch): what a launch of
# mpiformer came to, and restarting one that failed from the last complete
# checkpoint, without a person.
#
# How a launch ended (launch_outcome):
#   finished  exit 0 and RUN_DIR/finished written by this launch: it reached
#             its last step (or [train] stop_at). Exit 0 alone proves
#             nothing: srun has returned 0 after failing to start the ranks.
#   input     exit 2: bad input (a deck, a file). A person must fix it.
#   requeue   exit 75: checkpointed to be requeued (preemption, time limit,
#             Ctrl-C). The caller's path: train.sbatch requeues, local.sh
#             exits 75.
#   watchdog  exit 76: the watchdog ended a stuck rank. train.sbatch requeues
#             the job (likely onto other nodes); local.sh restarts it.
#   storage   exit 74: an output could not be written (a full or read-only
#             file system). A restart would fail the same way: not restarted.
#   failed    anything else, and exit 0 without the marker: a rank died or
#             was killed, a rank hit a fatal error (exit 3), the launcher
#             could not start the ranks. Restarted.
#
# Parameters (environment variables; defaults in brackets):
#   MAX_FAILURE_RESTARTS  restarts after failures, per job [3]
#   RESTART_BACKOFF_S     the n-th restart waits n x this many seconds [10]
# Each restart resumes from the run's `latest` checkpoint ([checkpoint]
# resume = "auto", the default). It is logged with its reason, the restart
# count and the steps the failure lost (logged since the last checkpoint),
# appended to RUN_DIR/restarts.log, and RUN_DIR/failure-restarts holds the
# number of failure restarts the run directory has seen.

MAX_FAILURE_RESTARTS=${MAX_FAILURE_RESTARTS:-3}
RESTART_BACKOFF_S=${RESTART_BACKOFF_S:-10}

# run_file FILE MODE TEXT: TEXT as a line into FILE, appended (MODE >>) or
# replacing it (MODE >, through a temporary name); never through a link or
# into a FIFO or anything else that is not a regular file planted in its
# place (said, and nothing written: the run goes on without that record).
run_file() {
  local f=$1 mode=$2 text=$3
  if [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; then
    echo "== $f is not a regular file (a link, a FIFO?): not writing through it; remove it" >&2
    return 1
  fi
  if [ "$mode" = ">>" ]; then
    printf '%s\n' "$text" >>"$f"
  else
    printf '%s\n' "$text" >"$f.tmp.$$" && mv -f "$f.tmp.$$" "$f"
  fi
}

# run_count FILE: the count a run directory's FILE holds (0 when absent).
# Anything but digits (a damaged or planted file) reads as 0, said so:
# shell arithmetic on a file's text would run what it names.
run_count() {
  local v
  [ -f "$1" ] && [ ! -L "$1" ] || { echo 0; return; }
  v=$(head -c 32 "$1" 2>/dev/null | tr -d '[:space:]')
  if [[ ! $v =~ ^[0-9]{1,9}$ ]]; then
    echo "== $1 does not hold a count ('${v:0:20}'): taken as 0" >&2
    v=0
  fi
  echo $((10#$v))
}

# deck_value SECTION KEY DEFAULT DECK [ARGS...]: the value a run will use,
# "--set SECTION.KEY=V" among ARGS winning over the deck (quotes stripped).
deck_value() {
  local section=$1 key=$2 default=$3 deck=$4 v prev= a
  shift 4
  for a in "$@"; do
    if [ "$prev" = --set ] && [ "${a%%=*}" = "$section.$key" ]; then v=${a#*=}; fi
    prev=$a
  done
  [ -n "${v:-}" ] || v=$(awk -v s="[$section]" -v k="$key" \
    '/^\[/{sec=$1} sec==s && $1==k {print $3}' "$deck" 2>/dev/null | tail -1)
  v=${v//\"/}
  echo "${v:-$default}"
}

# launch_outcome RC RUN_DIR: sets `outcome` (above) and `why`.
launch_outcome() {
  local rc=$1 dir=$2
  if [ "$rc" -eq 0 ] && [ -f "$dir/finished" ]; then
    outcome=finished why=$(head -1 "$dir/finished")
    return
  fi
  case $rc in
    0) outcome=failed why="exit 0 without reaching the last step (no $dir/finished): the launch failed or was cut short" ;;
    2) outcome=input why="bad input (exit 2): see mpiformer's message; not restarted" ;;
    75) outcome=requeue why="checkpointed and stopped to be requeued (exit 75)" ;;
    76) outcome=watchdog why="the watchdog ended a stuck job (exit 76)" ;;
    74) outcome=storage why="an output could not be written (exit 74: a full or read-only file system?); free space and run again to resume; not restarted" ;;
    *) outcome=failed
       if [ "$rc" -gt 128 ]; then
         why="a rank or the launcher ended by signal $((rc - 128)) (exit $rc)"
       else
         why="exit $rc: a rank failed, or the launcher could not start the ranks"
       fi ;;
  esac
}

# steps_lost RUN_DIR: steps logged after the last checkpoint saved, which
# the restart computes again.
steps_lost() {
  local m=$1/metrics.jsonl last saved
  last=$(grep -o '"step": [0-9]*' "$m" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  saved=$(grep -o '"checkpoint_saved": [0-9]*' "$m" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  last=${last:-0} saved=${saved:-0}
  echo $(( last > saved ? last - saved : 0 ))
}

# backoff SECONDS: waits; returns 1 when INT, TERM, HUP or USR1 arrived
# meanwhile (nothing runs then: the last checkpoint stands).
backoff() {
  local stopped=0 s
  trap 'stopped=1' INT TERM HUP USR1
  sleep "$1" &
  s=$!
  while kill -0 "$s" 2>/dev/null && [ "$stopped" -eq 0 ]; do wait "$s" 2>/dev/null; done
  kill "$s" 2>/dev/null
  trap - INT TERM HUP USR1
  return "$stopped"
}

# run_until_done RUN_DIR OUTCOMES: runs "${cmd[@]}" (run_forwarding, from
# forward-signals.sh) until a launch ends in an outcome not among OUTCOMES
# (those restarted, e.g. "failed watchdog") or the restarts are spent.
# Before each restart it calls the caller's `before_restart` where one is
# defined: it may rebuild `cmd` (train.sbatch: the healthy nodes), or set
# `why` and return non-zero to give up. Sets `rc`, `outcome` and `why`; a
# restartable outcome at the end means the job failed, and rc is non-zero.
run_until_done() {
  local dir=$1 restart_on=" $2 " restarts=0 lost total line
  while :; do
    rm -f "$dir/finished"
    if [ -n "${launch_log:-}" ]; then
      # A new file each launch, never through a link left in its place.
      rm -f "$launch_log"
      # The launch's stderr also into launch_log (the caller's, for laying
      # a failure to a node); exec keeps the launcher's pid for the signals.
      run_forwarding bash -c 'exec "$@" 2> >(tee "$0" >&2)' "$launch_log" "${cmd[@]}"
    else
      run_forwarding "${cmd[@]}"
    fi
    launch_outcome "$rc" "$dir"
    echo "== mpiformer launch ended: $why"
    case $restart_on in *" $outcome "*) ;; *) return 0 ;; esac
    [ "$rc" -ne 0 ] || rc=1
    if [ "$restarts" -ge "$MAX_FAILURE_RESTARTS" ]; then
      echo "== FAILED after $restarts restart(s) (MAX_FAILURE_RESTARTS $MAX_FAILURE_RESTARTS): $why" >&2
      return 0
    fi
    restarts=$((restarts + 1))
    mkdir -p "$dir"
    lost=$(steps_lost "$dir")
    total=$(( $(run_count "$dir/failure-restarts") + 1 ))
    run_file "$dir/failure-restarts" ">" "$total" || true
    line="failure restart $restarts of at most $MAX_FAILURE_RESTARTS ($total in this run directory) after: $why; $lost step(s) since the last checkpoint are redone"
    run_file "$dir/restarts.log" ">>" "$(date -u +%FT%TZ) $line" || true
    echo "== $line; restarting in $((restarts * RESTART_BACKOFF_S)) s"
    if ! backoff $((restarts * RESTART_BACKOFF_S)); then
      echo "== stop requested while waiting to restart: the last checkpoint stands"
      rc=75 outcome=requeue why="stopped while waiting to restart"
      return 0
    fi
    if declare -F before_restart >/dev/null && ! before_restart; then
      echo "== FAILED: cannot restart: $why" >&2
      return 0
    fi
  done
}
