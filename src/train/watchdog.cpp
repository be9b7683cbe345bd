#include "train/watchdog.hpp"

#include <unistd.h>

#include "core/exit_cleanup.hpp"
#include "core/output_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>

#include "core/format.hpp"

namespace mpiformer {

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Heartbeats are written this often: a few per limit, at most every 10 s.
double heartbeat_period(double limit) { return std::clamp(limit / 5, 0.5, 10.0); }

}  // namespace

Watchdog::Watchdog(double limit_s, const std::string& run_dir, int rank, int world)
    : fixed_limit_(limit_s), dir_(run_dir + "/heartbeat"), rank_(rank), world_(world) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  host_ = host;
  phase_ = Phase{"setting up", "", 0, 0, Clock::now()};
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);  // no heartbeats then; the watchdog still works
  monitor_ = std::thread([this] { monitor(); });
  writer_ = std::thread([this] { publish(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  monitor_.join();
  writer_.join();
}

void Watchdog::enter(const std::string& what, int64_t step, const std::string& peer,
                     double allowance_s) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_.what = what;
  phase_.peer = peer;
  phase_.step = step;
  phase_.allowance = allowance_s;
  phase_.since = Clock::now();
}

void Watchdog::step_took(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  // The recent steps only: the median follows a run whose steps change.
  if (step_times_.size() == 64) step_times_.erase(step_times_.begin());
  step_times_.push_back(seconds);
}

double Watchdog::limit() const {
  if (fixed_limit_ > 0) return fixed_limit_;
  std::vector<double> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = step_times_;
  }
  if (t.empty()) return kMinAutoLimit;
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return std::max(kMinAutoLimit, kAutoStepFactor * t[t.size() / 2]);
}

void Watchdog::monitor() {
  for (;;) {
    const double lim = limit();  // locks mu_: not under the lock below
    Phase p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto tick = std::chrono::duration<double>(std::clamp(lim / 20, 0.05, 1.0));
      if (stop_cv_.wait_for(lock, tick, [this] { return stopping_; })) return;
      p = phase_;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - p.since).count();
    const double allowed = std::max(lim, p.allowance);
    if (waited > allowed) fire(p, waited, allowed);
  }
}

std::string Watchdog::heartbeat_line(const Phase& p) const {
  const double in_phase = std::chrono::duration<double>(Clock::now() - p.since).count();
  return strprintf("%.3f host %s pid %d: %s of step %lld%s, for %.1f s", wall_now(), host_.c_str(),
                   static_cast<int>(::getpid()), p.what.c_str(), static_cast<long long>(p.step),
                   p.peer.empty() ? "" : (", waiting for " + p.peer).c_str(), in_phase);
}

void Watchdog::publish() {
  const std::string path = dir_ + strprintf("/rank-%d", rank_), tmp = path + ".tmp";
  for (;;) {
    Phase p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      p = phase_;
    }
    // Never through a link planted in its place (output_file.hpp); a name
    // that cannot be written skips this beat, the watchdog goes on.
    try {
      const int fd = open_output(tmp, OutputMode::kReplace, "[run] dir");
      const std::string line = heartbeat_line(p) + "\n";
      const bool whole = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
      ::close(fd);
      if (whole) std::rename(tmp.c_str(), path.c_str());  // readers see a whole line or the last one
    } catch (const std::exception&) {
    }
    const auto period = std::chrono::duration<double>(heartbeat_period(limit()));  // locks mu_
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_cv_.wait_for(lock, period, [this] { return stopping_; })) return;
  }
}

void Watchdog::fire(const Phase& p, double waited, double limit) {
  std::fprintf(stderr,
               "mpiformer: watchdog: rank %d (%s, pid %d) has been in %s of step %lld%s for "
               "%.1f s, over its limit of %.1f s ([run] watchdog_s%s); ending the job (exit %d)\n",
               rank_, host_.c_str(), static_cast<int>(::getpid()), p.what.c_str(),
               static_cast<long long>(p.step),
               p.peer.empty() ? "" : (", waiting for " + p.peer).c_str(), waited, limit,
               fixed_limit_ > 0 ? "" : " automatic: 10 x the median step, at least 300 s",
               kExitWatchdog);
  std::fflush(stderr);
  // Every rank's last heartbeat, read by a helper that may hang with the
  // file system; it gets a few seconds.
  auto report = std::make_shared<std::promise<std::string>>();
  auto ready = report->get_future();
  std::thread([report, dir = dir_, world = world_, period = heartbeat_period(limit)] {
    std::string text;
    const double now = wall_now();
    for (int r = 0; r < world; ++r) {
      std::string line;
      std::ifstream in(dir + strprintf("/rank-%d", r));
      if (!in || !std::getline(in, line)) {
        text += strprintf("  rank %d: no heartbeat\n", r);
        continue;
      }
      const double at = std::atof(line.c_str());
      const double age = now - at;
      text += strprintf("  rank %d: %s (heartbeat %.1f s ago)%s\n", r,
                        line.substr(line.find(' ') + 1).c_str(), age,
                        age > 3 * period + 2 ? "  <- SILENT: stopped, hung or dead" : "");
    }
    report->set_value(text);
  }).detach();
  if (ready.wait_for(std::chrono::seconds(5)) == std::future_status::ready) {
    std::fprintf(stderr, "mpiformer: watchdog: the last heartbeat of every rank (%s):\n%s",
                 dir_.c_str(), ready.get().c_str());
  } else {
    std::fprintf(stderr, "mpiformer: watchdog: %s did not answer in 5 s (a hung file system?)\n",
                 dir_.c_str());
  }
  std::fflush(stderr);
  // Not exit(): destructors and MPI_Finalize could wait on the stuck peer.
  remove_registered_files();
  ::_exit(kExitWatchdog);
}

}  // namespace mpiformer
