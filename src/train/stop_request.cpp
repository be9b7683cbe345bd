#include "train/stop_request.hpp"

#include <csignal>

namespace mpiformer {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking MPI and file calls carry on
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C where the ranks share the terminal (srun)
}

int stop_signal() { return g_signal; }

}  // namespace mpiformer
