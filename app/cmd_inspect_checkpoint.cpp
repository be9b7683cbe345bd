#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "core/format.hpp"
#include "train/checkpointing.hpp"

namespace mpiformer {

int inspect_checkpoint(const std::string& path) {
  CheckpointReader r(path);
  const CheckpointMeta& m = r.meta();
  std::printf("file:        %s\n", path.c_str());
  std::printf("format:      mpiformer checkpoint, version %lld\n",
              static_cast<long long>(m.format_version));
  std::printf("run:         %s%s\n", m.run_id.empty() ? "(no id: version 1)" : m.run_id.c_str(),
              m.format_version >= 2 ? ", root attributes verify" : "");
  std::printf("step:        %lld\n", static_cast<long long>(m.step));
  std::printf("tokens seen: %lld (%lld samples, epoch %lld, seed %lld)\n",
              static_cast<long long>(m.tokens_seen), static_cast<long long>(m.sample_position),
              static_cast<long long>(m.epoch), static_cast<long long>(m.seed));
  std::printf("written by:  dp %lld x pp %lld x tp %lld%s, %lld rank(s)\n",
              static_cast<long long>(m.dp), static_cast<long long>(m.pp),
              static_cast<long long>(m.tp),
              m.cp > 1 ? strprintf(" x cp %lld", static_cast<long long>(m.cp)).c_str() : "",
              static_cast<long long>(m.world_size));
  std::printf("model:       %lld layers, %lld heads, %lld channels, seq_len %lld, vocab %lld, "
              "tokenizer %s\n",
              static_cast<long long>(m.n_layer), static_cast<long long>(m.n_head),
              static_cast<long long>(m.n_embd), static_cast<long long>(m.seq_len),
              static_cast<long long>(m.vocab_size), m.tokenizer.c_str());
  if (m.family == 1) {
    std::printf("family:      llama: %lld kv heads, ffn_hidden %lld, rope_theta %g, norm_eps %g, "
                "%s head\n",
                static_cast<long long>(m.n_kv_head), static_cast<long long>(m.ffn_hidden),
                m.rope_theta, m.norm_eps, m.tie_embeddings ? "tied" : "untied");
  } else {
    std::printf("family:      gpt2\n");
  }
  if (m.experts > 0)
    std::printf("experts:     %lld per sparse layer (every %lld), top %lld, capacity factor %g, "
                "aux loss %g, z loss %g\n",
                static_cast<long long>(m.experts), static_cast<long long>(m.moe_every),
                static_cast<long long>(m.top_k), m.capacity_factor, m.aux_loss, m.router_z_loss);
  // What the file holds is checked against what a checkpoint of its model
  // must hold (the schema), so a missing tensor is found, not overlooked.
  struct Group {
    int64_t tensors = 0, elements = 0;
  };
  std::map<std::string, Group> groups;
  std::map<std::string, std::vector<int64_t>> present;
  for (const auto& [name, shape] : r.datasets()) present[name] = shape;
  int64_t damaged = 0, missing = 0;
  const auto expected = checkpoint_datasets(model_config(m));
  for (const auto& d : expected) {
    const auto it = present.find(d.name);
    if (it == present.end()) {
      // Not among the file's own datasets: absent, or a link elsewhere
      // (which a resume refuses the same way).
      if (const std::string why = r.verify(d.name, d.shape); why != "missing") {
        ++damaged;
        std::printf("DAMAGED:     %s: %s\n", d.name.c_str(), why.c_str());
        continue;
      }
      ++missing;
      std::printf("MISSING:     %s\n", d.name.c_str());
      continue;
    }
    present.erase(it);
    int64_t n = 1;
    for (int64_t x : d.shape) n *= x;
    Group& g = groups[d.name.substr(0, d.name.rfind('/'))];
    ++g.tensors;
    g.elements += n;
    if (const std::string why = r.verify(d.name, d.shape); !why.empty()) {
      ++damaged;
      std::printf("DAMAGED:     %s: %s\n", d.name.c_str(), why.c_str());
    }
  }
  // [train] grad_compression's residuals, one dataset per rank: verified,
  // counted apart (not tensors of the model).
  for (auto it = present.begin(); it != present.end();) {
    if (it->first.rfind("/grad_compression/", 0) != 0) {
      ++it;
      continue;
    }
    Group& g = groups["/grad_compression (error feedback's residuals, a dataset per rank)"];
    ++g.tensors;
    g.elements += it->second.empty() ? 0 : it->second[0];
    if (const std::string why = r.verify(it->first, it->second); !why.empty()) {
      ++damaged;
      std::printf("DAMAGED:     %s: %s\n", it->first.c_str(), why.c_str());
    }
    it = present.erase(it);
  }
  for (const auto& [name, shape] : present) {
    std::printf("UNEXPECTED:  %s (not part of this model)\n", name.c_str());
  }
  for (const auto& [name, g] : groups) {
    const bool residuals = name.rfind("/grad_compression", 0) == 0;
    std::printf("%-12s %lld %s, %lld %s, %.1f MB\n", (name + ":").c_str(),
                static_cast<long long>(g.tensors), residuals ? "datasets" : "tensors",
                static_cast<long long>(g.elements), residuals ? "values" : "parameters",
                4.0 * static_cast<double>(g.elements) / 1e6);
  }
  const auto total = static_cast<long long>(expected.size());
  if (missing > 0) {
    std::printf("complete:    NO, %lld of the model's %lld datasets missing\n",
                static_cast<long long>(missing), total);
  }
  if (damaged > 0) {
    std::printf("checksums:   %lld of %lld datasets FAIL\n", static_cast<long long>(damaged), total);
  }
  if (missing > 0 || damaged > 0) return 2;
  std::printf("checksums:   all %lld datasets verify (xxh64)\n", total);
  return 0;
}

}  // namespace mpiformer
