// What `mpiformer calibrate` is measuring, as it goes (rank 0, stderr): each
// phase when it starts, with what is still to come, and within a phase of
// several points, every few seconds, how many are done, what comes next and
// about how long the rest will take at the pace so far (points weighted by
// their expected cost: a whole stage of GPT-2 small costs a thousand of the
// tiny model's). A calibration runs minutes; a user
// must see it working and know when it will end.
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "train/calibration_timing.hpp"

namespace mpiformer::calibration {

class Progress {
 public:
  // `phases`: every phase's name, in order (the ones still to come are
  // named when a phase starts). Silent on every rank but `rank` 0.
  Progress(int rank, std::vector<std::string> phases, double report_every = 5)
      : quiet_(rank != 0), phases_(std::move(phases)), every_(report_every), start_(now()) {}

  // Phase `index` starts, with `points` measurements (0: one whole) of
  // total cost `work` (0: one each).
  void begin(size_t index, int points, double work = 0) {
    phase_ = index;
    points_ = points;
    done_ = 0;
    work_ = work > 0 ? work : points;
    work_done_ = 0;
    phase_start_ = last_ = now();
    if (quiet_) return;
    std::string next;
    for (size_t i = index + 1; i < phases_.size(); ++i) next += (next.empty() ? "" : ", ") + phases_[i];
    std::fprintf(stderr, "calibrate: [%zu/%zu] %s%s (%.0f s so far)%s%s\n", index + 1,
                 phases_.size(), phases_[index].c_str(),
                 points > 0 ? (" (" + std::to_string(points) + " points)").c_str() : "",
                 now() - start_, next.empty() ? "" : "; then ", next.c_str());
    std::fflush(stderr);
  }
  // One point of the phase measured, of cost `work` (as begin's); `what`
  // names the next (or "").
  void point(double work = 1, const std::string& what = "") {
    ++done_;
    work_done_ += work;
    const double t = now();
    if (quiet_ || points_ <= 0 || done_ >= points_ || t - last_ < every_) return;
    last_ = t;
    const double left = (t - phase_start_) / work_done_ * std::max(0.0, work_ - work_done_);
    std::fprintf(stderr, "calibrate:   %s: %d/%d, about %.0f s left in this phase%s%s\n",
                 phases_[phase_].c_str(), done_, points_, left, what.empty() ? "" : "; next ",
                 what.c_str());
    std::fflush(stderr);
  }
  double elapsed() const { return now() - start_; }

 private:
  bool quiet_;
  std::vector<std::string> phases_;
  double every_, start_, phase_start_ = 0, last_ = 0, work_ = 0, work_done_ = 0;
  size_t phase_ = 0;
  int points_ = 0, done_ = 0;
};

}  // namespace mpiformer::calibration
