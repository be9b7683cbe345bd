// Preemption: SIGUSR1 (Slurm's warning before the time limit, when asked
// with --signal), SIGTERM (scancel, preemption) and SIGINT (Ctrl-C where a
// rank shares the terminal; jobs/local.sh turns its own into SIGUSR1) only
// set a flag. The trainer reads it once per step, inside the step's
// existing all-reduce, so every rank agrees on the same last step; it then
// checkpoints and exits with kExitRequeue. A second signal during the save changes nothing.
#pragma once

namespace mpiformer {

// "Stopped to be requeued": the job scripts requeue on this code only.
// (EX_TEMPFAIL from sysexits.h.)
constexpr int kExitRequeue = 75;

void install_stop_handlers();
// The signal that asked to stop, or 0.
int stop_signal();

}  // namespace mpiformer
