#include "train/data_summary.hpp"

#include <numeric>

#include "core/format.hpp"

namespace mpiformer {

namespace {

// The epochs of source i over the run: its share of the samples (exact
// within one, blend_order.hpp) over its windows.
double epochs_over_run(const DataFeeder& data, size_t i, int64_t run_samples) {
  double total = 0;
  for (const TrainSource& s : data.sources()) total += s.weight;
  const TrainSource& s = data.sources()[i];
  return s.weight / total * static_cast<double>(run_samples) /
         static_cast<double>(s.order->num_windows());
}

}  // namespace

std::vector<std::string> data_summary(const DataFeeder& data, int64_t run_samples) {
  std::vector<std::string> out;
  double total = 0;
  for (const TrainSource& s : data.sources()) total += s.weight;
  for (size_t i = 0; i < data.sources().size(); ++i) {
    const TrainSource& s = data.sources()[i];
    const TokenDataset& d = s.data;
    const std::string head = data.blended() ? strprintf("train: \"%s\" %s", s.name.c_str(), d.path().c_str())
                                            : "train: " + d.path();
    std::string share = data.blended() ? strprintf(", weight %s (%.1f%%)",
                                                   shortest_decimal(s.weight).c_str(),
                                                   100.0 * s.weight / total)
                                       : "";
    out.push_back(strprintf("%s (%s, %lld tokens, %lld windows, tokenizer %s%s, %.2f epochs over "
                            "the run)",
                            head.c_str(), d.format().c_str(), static_cast<long long>(d.num_tokens()),
                            static_cast<long long>(s.order->num_windows()), d.tokenizer().c_str(),
                            share.c_str(), epochs_over_run(data, i, run_samples)));
  }
  for (const EvalSet& e : data.eval_sets()) {
    // Before plan() (the planner's view) no windows are chosen yet.
    const std::string windows =
        e.windows.empty() ? "" : strprintf(", %lld windows evaluated", static_cast<long long>(e.windows.size()));
    out.push_back(strprintf("%s %s (%lld tokens%s)",
                            e.source.empty() ? "val:  " : ("val:   \"" + e.source + "\"").c_str(),
                            e.data.path().c_str(), static_cast<long long>(e.data.num_tokens()),
                            windows.c_str()));
  }
  return out;
}

std::vector<std::string> repeat_warnings(const DataFeeder& data, int64_t run_samples,
                                         int64_t warn_repeats) {
  std::vector<std::string> out;
  for (size_t i = 0; i < data.sources().size(); ++i) {
    const double e = epochs_over_run(data, i, run_samples);
    if (e > static_cast<double>(warn_repeats)) {
      out.push_back(strprintf("source \"%s\" will be seen %.2f times over the run's %lld samples, "
                              "more than [data] warn_repeats = %lld (add data, lower its weight, "
                              "or raise warn_repeats if this is meant)",
                              data.sources()[i].name.c_str(), e,
                              static_cast<long long>(run_samples),
                              static_cast<long long>(warn_repeats)));
    }
  }
  return out;
}

}  // namespace mpiformer
