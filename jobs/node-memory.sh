# Sourced by train.sbatch: the nodes a run directory remembers as bad, so
# that a node that failed the run, or that mpiformer's start-up health check
# named slow, is not used again by a restart, a requeue or the next segment
# of a chain, even when it passes Slurm's state and the probe step.
#
# The memory, kept in the run directory across launches, jobs and segments:
#   RUN_DIR/node-failures    "node unix-time what", one line per failed launch
#                            laid to a node (written here)
#   RUN_DIR/unhealthy-hosts  "host unix-time what", written by mpiformer's
#                            start-up health check ([run] health_check)
# A node is excluded once mpiformer's health check named it, or once
# MAX_NODE_FAILURES failed launches were laid to it. Delete a node's lines
# (or the files) to trust it again.
#
# A failed launch is laid to the node of its first rank that ended by a
# signal (killed, OOM-killed, crashed), in the launcher's own words (srun:
# "error: NODE: task N: Killed"; mpirun: "rank N ... on node NODE exited on
# signal S"), or to a node that failed the probe before the restart. Ranks
# that exit with an error code (bad input, NaN, a peer gone) blame no node:
# every rank says the same.
#
# Parameters: MAX_NODE_FAILURES [2]

MAX_NODE_FAILURES=${MAX_NODE_FAILURES:-2}

# excluded_nodes DIR: "node why" for each node the run directory excludes.
excluded_nodes() {
  local dir=$1
  {
    [ -f "$dir/unhealthy-hosts" ] && awk '{ print "H", $1 }' "$dir/unhealthy-hosts"
    [ -f "$dir/node-failures" ] && awk '{ print "F", $1 }' "$dir/node-failures"
  } 2>/dev/null | awk -v max="$MAX_NODE_FAILURES" '
    $1 == "H" && !($2 in named) { named[$2] = 1; order[++n] = $2 }
    $1 == "F" { failed[$2]++; if (!($2 in seen)) { seen[$2] = 1; forder[++m] = $2 } }
    END {
      for (i = 1; i <= n; i++) print order[i], "named by the health check (unhealthy-hosts)"
      for (i = 1; i <= m; i++) {
        x = forder[i]
        if (failed[x] >= max && !(x in named))
          print x, failed[x] " failed launch(es) laid to it (node-failures; MAX_NODE_FAILURES " max ")"
      }
    }'
}

# launch_culprit LOG: the node of the launch's first rank ended by a signal,
# from the launcher's stderr in LOG; nothing when no rank was.
launch_culprit() {
  [ -f "$1" ] || return 0
  sed -n -E \
    -e 's/^srun: error: ([^: ]+): tasks? [0-9,-]+: (Killed|Terminated|Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception).*/\1/p' \
    -e 's/.*process rank [0-9]+ with PID [0-9]+ on node ([^ ]+) exited on signal.*/\1/p' \
    "$1" | head -1
}

# record_node_failure DIR NODE WHAT: one line into DIR/node-failures.
record_node_failure() {
  run_file "$1/node-failures" ">>" "$2 $(date +%s) $3" || true
  local n
  n=$(awk -v x="$2" '$1 == x' "$1/node-failures" 2>/dev/null | wc -l)
  echo "== node $2: $3 (failed launch $n laid to it of MAX_NODE_FAILURES $MAX_NODE_FAILURES)"
}

# drop_excluded DIR: removes the excluded nodes from `nodes`, saying why;
# sets `excluded` to them, comma-separated.
drop_excluded() {
  local node why kept=() n
  excluded=
  declare -A bad=()
  while read -r node why; do
    [ -n "$node" ] || continue
    bad[$node]=$why
  done < <(excluded_nodes "$1")
  for n in "${nodes[@]}"; do
    if [ -n "${bad[$n]:-}" ]; then
      echo "== node $n excluded: ${bad[$n]}"
      excluded=${excluded:+$excluded,}$n
    else
      kept+=("$n")
    fi
  done
  nodes=("${kept[@]}")
}

# exclude_from_pending DIR: the job's pending successors (chain.sh's next
# segment: a dependency on this job) are kept off every excluded node,
# where Slurm allows it (a pending job's ExcNodeList can change; a running
# one's cannot, so this job's own requeue cannot be steered).
exclude_from_pending() {
  local list job
  list=$(excluded_nodes "$1" | awk '{ print $1 }' | paste -sd, -)
  [ -n "$list" ] && [ -n "${SLURM_JOB_ID:-}" ] || return 0
  for job in $(squeue -h -t PENDING -o '%i %E' 2>/dev/null | awk -v me="$SLURM_JOB_ID" '$2 ~ ":" me "([^0-9]|$)" { print $1 }'); do
    scontrol update JobId="$job" ExcNodeList="$list" >/dev/null 2>&1 &&
      echo "== the next job $job will not run on $list"
  done
}
