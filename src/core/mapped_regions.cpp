#include "core/mapped_regions.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/exit_cleanup.hpp"
#include "core/signal_safe_table.hpp"

namespace mpiformer {

namespace {

// The handler reads it without locks or allocation.
constexpr size_t kText = 1024;
struct Region {
  uintptr_t begin = 0, end = 0;
  int exit_code = 0;
  char path[kText] = {};
  char advice[kText] = {};
};
SignalSafeTable<Region, 64> regions;
std::mutex install_mutex;
struct sigaction previous {};
bool installed = false;

void say(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Decimal, without the C library's formatting (not async-signal-safe).
void say_number(uint64_t v) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  say(buf + i);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  regions.for_each([at](const Region& r) {
    if (at < r.begin || at >= r.end) return;
    say("mpiformer: fatal: ");
    say(r.path);
    say(" was cut short while the run had it mapped (SIGBUS reading byte ");
    say_number(at - r.begin);
    say(" of it): something outside mpiformer truncated it. ");
    say(r.advice);
    say("\n");
    remove_registered_files();
    ::_exit(r.exit_code);
  });
  // Not ours: whoever handled SIGBUS before.
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(sig, info, context);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
             previous.sa_handler != nullptr) {
    previous.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}

void copy_text(char* dst, const std::string& src) {
  const size_t n = std::min(src.size(), kText - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

void guard_mapped_region(const void* addr, size_t bytes, const std::string& path,
                         const std::string& advice, int exit_code) {
  {
    const std::lock_guard<std::mutex> lock(install_mutex);
    if (!installed) {
      struct sigaction sa {};
      sa.sa_sigaction = on_sigbus;
      sa.sa_flags = SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGBUS, &sa, &previous);
      installed = true;
    }
  }
  // More mappings than slots: the extra ones die of the signal as before.
  regions.add([&](Region& r) {
    r.begin = reinterpret_cast<uintptr_t>(addr);
    r.end = r.begin + bytes;
    r.exit_code = exit_code;
    copy_text(r.path, path);
    copy_text(r.advice, advice);
  });
}

void unguard_mapped_region(const void* addr) {
  regions.remove_if(
      [addr](const Region& r) { return r.begin == reinterpret_cast<uintptr_t>(addr); });
}

}  // namespace mpiformer
