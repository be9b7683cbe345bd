#include "train/metrics_log.hpp"

#include "core/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {

MetricsLog::MetricsLog(const std::string& run_dir, bool active, bool append)
    : active_(active), path_(run_dir + "/metrics.jsonl") {
  if (!active_) return;
  // A link, a FIFO or a device in its place is refused (output_file.hpp).
  fd_ = open_output(path_, OutputMode::kAppend, "[run] dir", !append);
  // A last line left without its end (an older build killed mid-write)
  // stays a line of its own: this segment's records start on a new one.
  struct stat st {};
  char last = '\n';
  if (append && ::fstat(fd_, &st) == 0 && st.st_size > 0 &&
      ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n') {
    write_line("");
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// JSON has no NaN or infinity: a non-finite value is null.
std::string number(double x) { return std::isfinite(x) ? strprintf("%.9g", x) : "null"; }

}  // namespace

void MetricsLog::write_line(const std::string& json) {
  // One write per line, straight to the file: a crash or a kill loses no
  // logged line. A write that fails (a full disk) ends the run instead of
  // losing the log silently, and what part of the line got in is cut off
  // again: the file holds whole lines only, so readers and a resumed run
  // append to clean JSON lines.
  const std::string line = json + "\n";
  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) {
    const std::string why = n < 0 ? std::strerror(errno) : "no space for the whole line";
    if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      throw StorageError("cannot write " + path_ + " (" + why + "), nor cut off the torn line: " +
                         std::strerror(errno));
    }
    throw StorageError("cannot write " + path_ + ": " + why);
  }
}

void MetricsLog::step(const StepMetrics& m) {
  if (!active_) return;
  const int w = static_cast<int>(std::to_string(m.steps).size());
  std::string line = strprintf(
      "step %*lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% | "
      "%.1f ms | ETA %s",
      w, static_cast<long long>(m.step), static_cast<long long>(m.steps), m.loss, m.lr,
      m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, m.step_ms, clock_duration(m.eta_s).c_str());
  std::string json = strprintf(
      "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
      "\"tokens_per_s\": %.6g, \"mfu\": %.6g, \"step_ms\": %.6g, \"samples\": %lld",
      static_cast<long long>(m.step), number(m.loss).c_str(), m.lr, number(m.grad_norm).c_str(),
      m.tokens_per_s, m.mfu, m.step_ms, static_cast<long long>(m.samples));
  if (!m.skipped.empty()) {
    line += " | update skipped (" + m.skipped + ")";
    json += ", \"skipped\": " + json_string(m.skipped);
  }
  if (!m.stopped.empty()) {
    line += " | stopping (" + m.stopped + ")";
    json += ", \"stopped\": " + json_string(m.stopped);
  }
  if (m.skipped_steps > 0) {
    json += strprintf(", \"skipped_steps\": %lld", static_cast<long long>(m.skipped_steps));
  }
  if (m.loss_scaling) {
    line += strprintf(" | loss scale %g", m.loss_scale);
    json += strprintf(", \"loss_scale\": %.17g, \"overflow\": %s, \"overflows\": %lld",
                      m.loss_scale, m.overflow ? "true" : "false",
                      static_cast<long long>(m.overflows));
  }
  if (m.moe) {
    line += strprintf(" | aux %.3f | expert load %.2f-%.2f | dropped %.1f%%", m.aux_loss,
                      m.load_min, m.load_max, 100 * m.dropped);
    json += strprintf(", \"aux_loss\": %s, \"z_loss\": %s, \"expert_load_min\": %.6g, "
                      "\"expert_load_max\": %.6g, \"dropped_fraction\": %.6g",
                      number(m.aux_loss).c_str(), number(m.z_loss).c_str(), m.load_min,
                      m.load_max, m.dropped);
  }
  if (m.host_timings) {
    json += strprintf(", \"matmul_fraction\": %.4g, \"optimizer_ms\": %.4g", m.matmul_fraction,
                      m.optimizer_ms);
  }
  if (m.pipelined && m.host_timings) {
    line += strprintf(" | bubble %.0f%% (theory %.0f%%)", 100 * m.bubble, 100 * m.bubble_theory);
    json += strprintf(", \"bubble\": %.4g, \"bubble_theory\": %.4g", m.bubble, m.bubble_theory);
  } else if (m.pipelined) {
    line += strprintf(" | bubble theory %.0f%%", 100 * m.bubble_theory);
    json += strprintf(", \"bubble_theory\": %.4g", m.bubble_theory);
  }
  if (m.data_parallel && m.host_timings) {
    line += strprintf(" | reduce exposed %.1f ms", m.reduce_exposed_ms);
    json += strprintf(", \"reduce_exposed_ms\": %.4g", m.reduce_exposed_ms);
  }
  if (m.data_parallel) json += strprintf(", \"dp_sent_mb\": %.4g", m.dp_sent_mb);
  if (m.tensor_parallel && m.host_timings) {
    line += strprintf(" | tensor all-reduce %.0f%%", 100 * m.tp_reduce_fraction);
    json += strprintf(", \"tp_reduce_fraction\": %.4g", m.tp_reduce_fraction);
  }
  if (m.tensor_parallel) json += strprintf(", \"tp_sent_mb\": %.4g", m.tp_sent_mb);
  if (m.expert_parallel && m.host_timings) {
    line += strprintf(" | all-to-all %.1f ms", m.ep_alltoall_ms);
    json += strprintf(", \"ep_alltoall_ms\": %.4g", m.ep_alltoall_ms);
  }
  if (m.expert_parallel) json += strprintf(", \"ep_sent_mb\": %.4g", m.ep_sent_mb);
  if (m.context_parallel && m.host_timings) {
    line += strprintf(" | ring %.1f ms (waits %.1f)", m.cp_ring_ms, m.cp_wait_ms);
    json += strprintf(", \"cp_ring_ms\": %.4g, \"cp_wait_ms\": %.4g", m.cp_ring_ms, m.cp_wait_ms);
  }
  if (m.context_parallel) json += strprintf(", \"cp_sent_mb\": %.4g", m.cp_sent_mb);
  std::puts(line.c_str());
  std::fflush(stdout);
  write_line(json + "}");
}

void MetricsLog::eval(int64_t step, int64_t steps, double val_loss,
                      const std::vector<std::pair<std::string, double>>& per_source) {
  if (!active_) return;
  std::string line = strprintf("step %lld/%lld | val loss %.4f", static_cast<long long>(step),
                               static_cast<long long>(steps), val_loss);
  std::string json = strprintf("{\"step\": %lld, \"val_loss\": %s", static_cast<long long>(step),
                               number(val_loss).c_str());
  for (const auto& [name, loss] : per_source) {
    line += strprintf(" | %s %.4f", name.c_str(), loss);
    json += strprintf(", %s: %s", json_string("val_loss/" + name).c_str(), number(loss).c_str());
  }
  std::puts(line.c_str());
  std::fflush(stdout);
  write_line(json + "}");
}

void MetricsLog::record(const std::string& json) {
  if (active_) write_line(json);
}

}  // namespace mpiformer
