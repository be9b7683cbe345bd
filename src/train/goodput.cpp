#include "train/goodput.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/output_file.hpp"

namespace mpiformer {

namespace {

constexpr const char* kHeader = "mpiformer goodput ledger 1";
// A ledger holds a line per checkpoint a run could resume from: far less
// than this, whatever the run.
constexpr off_t kMostBytes = 16 << 20;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds since this process started (/proc: its start in clock ticks
// since boot, against the uptime), so a launch's wall time includes MPI's
// start-up; 0 where /proc cannot say.
double process_age() {
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string text;
  double uptime = 0;
  if (!std::getline(stat, text) || !(up >> uptime)) return 0;
  // Fields after the command name (which may hold spaces) start after ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  // starttime is field 22; the rest begins at field 3.
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
    if (i == 22) {
      const double ticks = std::atof(field.c_str());
      const long hz = ::sysconf(_SC_CLK_TCK);
      const double age = uptime - ticks / static_cast<double>(hz > 0 ? hz : 100);
      return age > 0 ? age : 0;
    }
  }
  return 0;
}

// key value pairs of one ledger line after its first word.
bool read_pairs(std::istringstream& in, const std::vector<std::pair<const char*, double*>>& want) {
  std::string key;
  double value = 0;
  size_t found = 0;
  while (in >> key >> value) {
    if (!std::isfinite(value) || value < 0) return false;
    for (const auto& [name, to] : want) {
      if (key == name) {
        *to = value;
        ++found;
      }
    }
  }
  return in.eof() && found == want.size();
}


// Below a minute in seconds (a short run's figures would all read 0:00).
std::string span(double s) { return s < 60 ? strprintf("%.1f s", s) : clock_duration(s); }

}  // namespace

double young_daly_interval(double save_seconds, double mtbf_seconds) {
  return std::sqrt(2 * save_seconds * mtbf_seconds);
}

GoodputLedger::GoodputLedger(std::string run_dir, bool active, bool resumed, int64_t resume_step)
    : path_(std::move(run_dir) + "/goodput.txt"), active_(active) {
  cur_.started = unix_now() - process_age();
  cur_.updated = cur_.started;
  cur_.resumed_from = cur_.step = resume_step;
  if (active_ && resumed) read_previous(resume_step);
}

void GoodputLedger::read_previous(int64_t s) {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) return;  // none: the run predates it
  auto refuse = [&](const std::string& why) {
    warning_ = path_ + ": " + why + "; the goodput figures start again from this launch";
    settled_ = GoodputTotals{};
    kept_.clear();
    base_ = 0;
  };
  if (!S_ISREG(st.st_mode)) return refuse("not a regular file");
  if (st.st_size > kMostBytes) return refuse(strprintf("%lld bytes, more than a ledger holds",
                                                       static_cast<long long>(st.st_size)));
  std::ifstream in(path_);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return refuse("line 1: not a goodput ledger");
  Launch prev;
  bool have_settled = false, have_launch = false;
  int number = 1;
  while (std::getline(in, line)) {
    ++number;
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    double launches = 0, redone = 0, saves = 0, steps = 0, resumed_from = 0, step = 0;
    bool ok = true;
    if (kind == "settled") {
      ok = read_pairs(words, {{"launches", &launches}, {"steps_redone", &redone},
                              {"wall", &settled_.wall}, {"startup", &settled_.startup},
                              {"restore", &settled_.restore}, {"steps", &settled_.steps},
                              {"saves", &settled_.saves}, {"evals", &settled_.evals},
                              {"between", &settled_.between}, {"save_count", &saves},
                              {"step_count", &steps}});
      settled_.launches = static_cast<int64_t>(launches);
      settled_.steps_redone = static_cast<int64_t>(redone);
      settled_.save_count = static_cast<int64_t>(saves);
      settled_.step_count = static_cast<int64_t>(steps);
      have_settled = ok;
    } else if (kind == "launch") {
      ok = read_pairs(words, {{"started", &prev.started}, {"updated", &prev.updated},
                              {"resumed_from", &resumed_from}, {"step", &step},
                              {"base", &base_}, {"startup", &prev.startup},
                              {"restore", &prev.restore}, {"steps", &prev.steps},
                              {"saves", &prev.saves}, {"evals", &prev.evals},
                              {"save_count", &saves}, {"step_count", &steps}});
      prev.resumed_from = static_cast<int64_t>(resumed_from);
      prev.step = static_cast<int64_t>(step);
      prev.save_count = static_cast<int64_t>(saves);
      prev.step_count = static_cast<int64_t>(steps);
      have_launch = ok;
    } else if (kind == "kept") {
      double at = 0, through = 0;
      ok = static_cast<bool>(words >> at >> through) && std::isfinite(through) && through >= 0 &&
           at >= 0 && (words >> std::ws).eof();
      if (ok) kept_.emplace_back(static_cast<int64_t>(at), through);
    } else {
      ok = false;
    }
    if (!ok) return refuse(strprintf("line %d: not understood", number));
  }
  if (!have_settled || !have_launch) return refuse("no settled or launch line");
  // Settle the launch before this one against the step this one resumed from.
  const double prev_productive = base_ + prev.steps;
  settled_.launches += 1;
  settled_.wall += std::max(0.0, prev.updated - prev.started);
  settled_.startup += prev.startup;
  settled_.restore += prev.restore;
  settled_.steps += prev.steps;
  settled_.saves += prev.saves;
  settled_.evals += prev.evals;
  settled_.save_count += prev.save_count;
  settled_.step_count += prev.step_count;
  settled_.steps_redone += std::max<int64_t>(0, prev.step - s);
  settled_.between += std::max(0.0, cur_.started - prev.updated);
  if (s >= prev.step) {
    base_ = prev_productive;
  } else {
    // The checkpoint resumed from: the last one kept at or before s.
    double through = 0;
    for (const auto& [at, t] : kept_)
      if (at <= s) through = t;
    base_ = through;
  }
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [&](const auto& k) { return k.first > s; }),
              kept_.end());
}

void GoodputLedger::steps_begin() {
  if (stepping_) return;
  stepping_ = true;
  cur_.startup = std::max(0.0, unix_now() - cur_.started);
}

void GoodputLedger::step_done(int64_t step, double seconds) {
  cur_.step = step;
  cur_.steps += seconds;
  cur_.step_count += 1;
}

void GoodputLedger::save_done(int64_t step, double seconds) {
  save_waited(seconds);
  checkpoint_kept(step, productive());
}

void GoodputLedger::save_waited(double seconds) { cur_.saves += seconds; }

void GoodputLedger::checkpoint_kept(int64_t step, double productive_through) {
  cur_.save_count += 1;
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [&](const auto& k) { return k.first >= step; }),
              kept_.end());
  kept_.emplace_back(step, productive_through);
  // A run resumes from one of its newest checkpoints; the ledger keeps the
  // last many thousand, far more than any run keeps on disk.
  constexpr size_t kMostKept = 10000;
  if (kept_.size() > kMostKept) kept_.erase(kept_.begin(), kept_.end() - kMostKept);
}

void GoodputLedger::eval_done(double seconds) { cur_.evals += seconds; }

void GoodputLedger::write(bool durable) {
  if (!active_) return;
  cur_.updated = unix_now();
  std::string t = std::string(kHeader) + "\n";
  const GoodputTotals& s = settled_;
  t += strprintf("settled launches %lld steps_redone %lld wall %.6f startup %.6f restore %.6f "
                 "steps %.6f saves %.6f evals %.6f between %.6f save_count %lld step_count %lld\n",
                 static_cast<long long>(s.launches), static_cast<long long>(s.steps_redone), s.wall,
                 s.startup, s.restore, s.steps, s.saves, s.evals, s.between,
                 static_cast<long long>(s.save_count), static_cast<long long>(s.step_count));
  t += strprintf("launch started %.6f updated %.6f resumed_from %lld step %lld base %.6f "
                 "startup %.6f restore %.6f steps %.6f saves %.6f evals %.6f save_count %lld "
                 "step_count %lld\n",
                 cur_.started, cur_.updated, static_cast<long long>(cur_.resumed_from),
                 static_cast<long long>(cur_.step), base_, cur_.startup, cur_.restore, cur_.steps,
                 cur_.saves, cur_.evals, static_cast<long long>(cur_.save_count),
                 static_cast<long long>(cur_.step_count));
  for (const auto& [at, through] : kept_)
    t += strprintf("kept %lld %.6f\n", static_cast<long long>(at), through);
  // Bookkeeping never stops a run: a write that fails (a full disk) is
  // said once, and the run's own outputs then report the disk.
  try {
    if (durable) {
      write_file_durably(path_, t);
    } else {
      // Between saves, whole but not flushed: a training step does not
      // wait for the disk (a crash of the node loses at most these lines).
      const std::string tmp = path_ + ".tmp";
      std::FILE* f = open_output_stream(tmp, OutputMode::kReplace, "[run] dir");
      const bool ok = std::fwrite(t.data(), 1, t.size(), f) == t.size();
      if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path_.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw StorageError("cannot write " + path_ + ": " + std::strerror(errno));
      }
    }
  } catch (const std::exception& e) {
    if (!write_failed_) std::fprintf(stderr, "mpiformer: warning: goodput figures not recorded: %s\n", e.what());
    write_failed_ = true;
  }
}

GoodputTotals GoodputLedger::totals() const {
  GoodputTotals t = settled_;
  t.launches += 1;
  t.wall += std::max(0.0, unix_now() - cur_.started);
  t.startup += stepping_ ? cur_.startup : std::max(0.0, unix_now() - cur_.started);
  t.restore += cur_.restore;
  t.steps += cur_.steps;
  t.productive = base_ + cur_.steps;
  t.saves += cur_.saves;
  t.evals += cur_.evals;
  t.save_count += cur_.save_count;
  t.step_count += cur_.step_count;
  return t;
}

double GoodputLedger::mean_save() const {
  const GoodputTotals t = totals();
  return t.save_count > 0 ? t.saves / static_cast<double>(t.save_count) : 0;
}

std::string GoodputLedger::json() const {
  const GoodputTotals t = totals();
  return strprintf(
      "{\"goodput\": {\"goodput\": %.6g, \"wall_s\": %.6g, \"productive_s\": %.6g, "
      "\"step_s\": %.6g, \"lost_s\": %.6g, \"save_s\": %.6g, \"startup_s\": %.6g, "
      "\"restore_s\": %.6g, \"eval_s\": %.6g, \"between_launches_s\": %.6g, \"launches\": %lld, "
      "\"steps_redone\": %lld, \"saves\": %lld}}",
      t.goodput(), t.wall, t.productive, t.steps, t.steps - t.productive, t.saves, t.startup,
      t.restore, t.evals, t.between, static_cast<long long>(t.launches),
      static_cast<long long>(t.steps_redone), static_cast<long long>(t.save_count));
}

std::string GoodputLedger::line() const {
  const GoodputTotals t = totals();
  std::string s = strprintf(
      "goodput %.1f%%: %s of kept steps in %s of wall time (%lld launch%s); saves %s "
      "(%lld, blocking), start-up %s (restore %s), evals %s, redone steps %s (%lld)",
      100 * t.goodput(), span(t.productive).c_str(), span(t.wall).c_str(),
      static_cast<long long>(t.launches), t.launches == 1 ? "" : "es", span(t.saves).c_str(),
      static_cast<long long>(t.save_count), span(t.startup).c_str(),
      span(t.restore).c_str(), span(t.evals).c_str(),
      span(t.steps - t.productive).c_str(), static_cast<long long>(t.steps_redone));
  if (t.between > 0) s += strprintf("; %s between launches", span(t.between).c_str());
  return s;
}

}  // namespace mpiformer
