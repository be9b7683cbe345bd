// A Chrome trace (JSON array format, loadable in Perfetto and
// chrome://tracing) of one rank's spans: forward, backward, send, recv,
// reduce, optimizer. Events are appended as they end and flushed once per
// step, so a killed job still leaves a readable prefix.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

namespace mpiformer {

class TraceWriter {
 public:
  // Inactive (every call a no-op) unless `enabled`.
  TraceWriter(bool enabled, const std::string& path, int rank, int stage, int dp_rank,
              int tp_rank);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  using Clock = std::chrono::steady_clock;
  // A complete span; micro < 0 for whole-step spans; chunk >= 0 names an
  // interleaved stage's model chunk.
  void span(const char* name, Clock::time_point begin, Clock::time_point end, int64_t step,
            int micro, int chunk = -1);
  void flush();

 private:
  std::FILE* file_ = nullptr;
  int rank_ = 0;
  Clock::time_point origin_;
  double origin_epoch_us_ = 0;  // wall clock at origin_: aligns ranks' tracks
};

}  // namespace mpiformer
