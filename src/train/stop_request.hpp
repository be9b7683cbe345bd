// Preemption: SIGUSR1 (Slurm's warning before the time limit, when asked
// with --signal), SIGTERM (scancel, preemption), SIGINT (Ctrl-C where a
// rank shares the terminal; jobs/local.sh turns its own into SIGUSR1) and
// SIGHUP (that terminal closed) only set a flag. The trainer reads it once per step, inside the step's
// existing all-reduce, so every rank agrees on the same last step; it then
// checkpoints and exits with kExitRequeue. A second signal during the save changes nothing.
#pragma once

#include "core/error.hpp"  // kExitRequeue

namespace mpiformer {

// Also notes the launcher (the parent process where an MPI launcher or
// srun started this one): a rank whose launcher vanished (SIGKILLed, its
// terminal closed) stops the same way instead of training on unwatched,
// holding the run directory's lock.
void install_stop_handlers();
// Whether a signal asked to stop or the launcher vanished.
bool stop_requested();
// Why, for the log: "SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP", "the launcher
// vanished"; "" when nothing asked.
const char* stop_cause();

}  // namespace mpiformer
