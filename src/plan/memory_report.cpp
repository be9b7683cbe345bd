#include "plan/memory_report.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/format.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace mpiformer {

std::vector<RankMemory> predicted_memory(const Deck& deck, const BackendChoice& backend) {
  std::vector<RankMemory> out;
  const int pp = static_cast<int>(deck.parallel.pp);
  for (int s = 0; s < pp; ++s) {
    // Each stage's schedule keeps its own number of micro-batches alive.
    const SlotKinds slots =
        schedule_slots(deck.parallel.schedule, pp, s, static_cast<int>(deck.grad_accum()),
                       static_cast<int>(deck.parallel.virtual_stages));
    out.push_back(rank_memory(deck, backend, s, slots));
  }
  return out;
}

std::string memory_table(const std::vector<RankMemory>& stages) {
  std::string t = "memory per rank, predicted (MB): stage | parameters | gradients | AdamW | "
                  "activations (slots x a whole chunk's, at most) | comm buffers | scratch | "
                  "total\n";
  for (size_t s = 0; s < stages.size(); ++s) {
    const RankMemory& m = stages[s];
    t += strprintf("  %zu | %.1f | %.1f | %.1f | %.1f (%d x %.1f) | %.1f | %.1f | %.1f\n", s,
                   m.parameters() / 1e6, m.gradients() / 1e6, m.optimizer / 1e6,
                   m.stage.activations / 1e6, m.slots, m.stage.per_slot / 1e6, m.comm / 1e6,
                   (m.stage.scratch + m.workspace + m.offload_buffers) / 1e6, m.total() / 1e6);
  }
  // Offloaded state: what the back end no longer holds, and where it went.
  for (size_t s = 0; s < stages.size(); ++s) {
    const RankMemory& m = stages[s];
    if (m.offload_host + m.offload_disk + m.offload_buffers == 0) continue;
    t += strprintf("  %zu | offloaded optimizer state: %.1f MB on disk, %.1f MB in host memory "
                   "outside the device's; %.1f MB of streaming blocks (in scratch)\n",
                   s, m.offload_disk / 1e6, m.offload_host / 1e6, m.offload_buffers / 1e6);
  }
  for (size_t s = 0; s < stages.size(); ++s) {
    const RankMemory& m = stages[s];
    const char* where = m.saves_in_total ? " (in the total)" : ", outside the device's";
    if (m.checkpoint_snapshot > 0)
      t += strprintf("  %zu | [checkpoint] async's snapshot: %.1f MB of host memory from the first "
                     "save on%s\n",
                     s, m.checkpoint_snapshot / 1e6, where);
    if (m.checkpoint_io > 0)
      t += strprintf("  %zu | a save's write and read-back: %.1f MB of host memory while it runs%s\n", s,
                     m.checkpoint_io / 1e6, where);
  }
  return t;
}

std::string memory_json(const std::vector<RankMemory>& stages) {
  std::string j = "{\"memory_predicted\": [";
  for (size_t s = 0; s < stages.size(); ++s) {
    const RankMemory& m = stages[s];
    j += strprintf("%s{\"stage\": %zu, \"parameters\": %.0f, \"gradients\": %.0f, "
                   "\"optimizer\": %.0f, \"activations\": %.0f, \"slots\": %d, "
                   "\"per_slot\": %.0f, \"comm\": %.0f, \"scratch\": %.0f, "
                   "\"workspace\": %.0f, \"offload_buffers\": %.0f, \"offload_host\": %.0f, "
                   "\"offload_disk\": %.0f, \"checkpoint_snapshot\": %.0f, \"checkpoint_io\": %.0f, "
                   "\"total\": %.0f}",
                   s == 0 ? "" : ", ", s, m.parameters(), m.gradients(), m.optimizer,
                   m.stage.activations, m.slots, m.stage.per_slot, m.comm, m.stage.scratch,
                   m.workspace, m.offload_buffers, m.offload_host, m.offload_disk,
                   m.checkpoint_snapshot, m.checkpoint_io, m.total());
  }
  return j + "]}";
}

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

double resident_high_water() {
  std::ifstream f("/proc/self/status");
  std::string key;
  double kb = 0;
  while (f >> key) {
    if (key == "VmHWM:") {
      f >> kb;
      return kb * 1024;
    }
  }
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux reports KiB
}

bool reset_resident_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f.flush());
}

namespace {
double g_kept_peak = 0;  // the mark before the last excluded probe
}  // namespace

double peak_resident_bytes() { return std::max(g_kept_peak, resident_high_water()); }

double excluding_from_peak(const std::function<double()>& f) {
  g_kept_peak = peak_resident_bytes();
  const double v = f();
  reset_resident_peak();
  return v;
}

}  // namespace mpiformer
