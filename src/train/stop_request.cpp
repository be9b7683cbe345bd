#include "train/stop_request.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <initializer_list>

namespace mpiformer {
namespace {

volatile std::sig_atomic_t g_signal = 0;
pid_t g_launcher = 0;  // 0: not started by a launcher, nothing to watch

extern "C" void on_stop_signal(int sig) { g_signal = sig; }

// mpirun (Open MPI, PMIx) and srun set these in every rank they start. A
// process started by hand may outlive its shell on purpose (nohup).
bool started_by_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_STEP_ID"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

// The parent changes (to init or a subreaper) only when it died.
bool launcher_vanished() { return g_launcher != 0 && ::getppid() != g_launcher; }

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking MPI and file calls carry on
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C where the ranks share the terminal (srun)
  sigaction(SIGHUP, &sa, nullptr);  // that terminal closed
  // A launcher that died took the read end of stdout with it: the log line
  // that follows must not kill a rank before it has checkpointed.
  std::signal(SIGPIPE, SIG_IGN);
  if (started_by_launcher()) g_launcher = ::getppid();
}

bool stop_requested() { return g_signal != 0 || launcher_vanished(); }

const char* stop_cause() {
  switch (g_signal) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return launcher_vanished() ? "the launcher vanished" : "";
  }
}

}  // namespace mpiformer
