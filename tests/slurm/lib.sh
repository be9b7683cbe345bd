# Shared by the Slurm tests: the e2e scratch directory and data, plus a
# private one-node Slurm. Exits 77 (CTest: skipped) with the reason when
# Slurm cannot run here; CI installs it (.ci/deps.sh) and runs as root.
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/../e2e/lib.sh"
# The jobs tear down as on a cluster: mpirun's own grace, not lib.sh's.
unset OMPI_MCA_odls_base_sigkill_timeout
source "$here/cluster.sh"
reason=$(slurm_skip_reason)
if [ -n "$reason" ]; then
  echo "SKIP: $reason"
  exit 77
fi
export SLURM_TEST_DIR=$WORK/slurm
trap 'slurm_down; rm -rf "$WORK"' EXIT
slurm_up || fail "could not start Slurm"
prep_sample_data
export DECK=$SOURCE_DIR/inputs/tiny.toml
export SBATCH_SCRIPT=$SOURCE_DIR/jobs/train.sbatch
# Small and quick, but several steps a second so a signal lands mid-run.
# A stated peak, as run_mpi gives (e2e/lib.sh): measuring it is six
# 2048-wide sgemms on every rank of every launch (6 s each where the BLAS
# ran generic kernels, about 1 s through oneDNN), and no test here reads MFU.
SMALL="$SMALL_BATCH --set train.log_every=1 --set run.peak_tflops=1"
job_log() { cat "mpiformer-$1.out" 2>/dev/null; }
show_job() { scontrol show job "$1"; job_log "$1"; tail -5 "$SLURM_TEST_DIR"/log/slurmctld.log; }
