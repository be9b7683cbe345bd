#include <cstdio>
#include <map>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "core/format.hpp"

namespace mpiformer {

int inspect_checkpoint(const std::string& path) {
  CheckpointReader r(path);
  const CheckpointMeta& m = r.meta();
  std::printf("file:        %s\n", path.c_str());
  std::printf("format:      mpiformer checkpoint, version %lld\n",
              static_cast<long long>(m.format_version));
  std::printf("step:        %lld\n", static_cast<long long>(m.step));
  std::printf("tokens seen: %lld (%lld samples, epoch %lld, seed %lld)\n",
              static_cast<long long>(m.tokens_seen), static_cast<long long>(m.sample_position),
              static_cast<long long>(m.epoch), static_cast<long long>(m.seed));
  std::printf("written by:  dp %lld x pp %lld, %lld rank(s)\n", static_cast<long long>(m.dp),
              static_cast<long long>(m.pp), static_cast<long long>(m.world_size));
  std::printf("model:       %lld layers, %lld heads, %lld channels, seq_len %lld, vocab %lld, "
              "tokenizer %s\n",
              static_cast<long long>(m.n_layer), static_cast<long long>(m.n_head),
              static_cast<long long>(m.n_embd), static_cast<long long>(m.seq_len),
              static_cast<long long>(m.vocab_size), m.tokenizer.c_str());
  struct Group {
    int64_t tensors = 0, elements = 0;
  };
  std::map<std::string, Group> groups;
  int64_t bad = 0, total = 0;
  for (const auto& [name, shape] : r.datasets()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Group& g = groups[name.substr(0, name.rfind('/'))];
    ++g.tensors;
    g.elements += n;
    ++total;
    if (const std::string why = r.verify(name, shape); !why.empty()) {
      ++bad;
      std::printf("DAMAGED:     %s: %s\n", name.c_str(), why.c_str());
    }
  }
  for (const auto& [name, g] : groups) {
    std::printf("%-12s %lld tensors, %lld parameters, %.1f MB\n", (name + ":").c_str(),
                static_cast<long long>(g.tensors), static_cast<long long>(g.elements),
                4.0 * static_cast<double>(g.elements) / 1e6);
  }
  if (bad > 0) {
    std::printf("checksums:   %lld of %lld datasets FAIL\n", static_cast<long long>(bad),
                static_cast<long long>(total));
    return 2;
  }
  std::printf("checksums:   all %lld datasets verify (xxh64)\n", static_cast<long long>(total));
  return 0;
}

}  // namespace mpiformer
