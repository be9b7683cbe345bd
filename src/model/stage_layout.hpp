// Where a stage's tensors sit in its flat parameter buffer, resolved once
// from the parameter table, and GPT-2's initial values: shared by the host
// and GPU stages so both hold the same model in the same places.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

struct StageLayout {
  // Per layer of the stage, in this order: ln_1 weight/bias, c_attn
  // weight/bias, attn c_proj weight/bias, ln_2 weight/bias, c_fc
  // weight/bias, mlp c_proj weight/bias.
  std::vector<std::array<int64_t, 12>> layers;
  int64_t wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;  // -1: not on this stage

  StageLayout(const ParameterTable& table, const StageRange& range) {
    static const char* const kLayerTensors[12] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    for (int64_t l = range.first_layer; l < range.last_layer; ++l) {
      std::array<int64_t, 12> o{};
      for (int k = 0; k < 12; ++k)
        o[k] = table.at("h." + std::to_string(l) + "." + kLayerTensors[k]).offset;
      layers.push_back(o);
    }
    if (range.has_embedding || range.has_head) wte = table.at("wte").offset;
    if (range.has_embedding) wpe = table.at("wpe").offset;
    if (range.has_head) {
      lnf_w = table.at("ln_f.weight").offset;
      lnf_b = table.at("ln_f.bias").offset;
    }
  }

  // Pointers into a flat buffer for layer i (P: a struct of 12 pointers).
  template <class P, class T>
  P layer(T* base, int64_t i) const {
    const auto& o = layers[i];
    return P{base + o[0], base + o[1], base + o[2],  base + o[3],  base + o[4],  base + o[5],
             base + o[6], base + o[7], base + o[8],  base + o[9],  base + o[10], base + o[11]};
  }
};

// GPT-2 initialisation into `out` (table order, padding zero); each tensor's
// values depend only on (seed, name), so every layout and device
// initialises the same model.
template <class T>
void fill_initial_parameters(const ParameterTable& table, uint64_t seed, T* out) {
  for (const auto& s : table.specs()) {
    T* p = out + s.offset;
    std::fill(p, p + s.storage, T(0));
    if (s.init_std == 0.0) {
      std::fill(p, p + s.numel(), static_cast<T>(s.init_value));
      continue;
    }
    Rng rng(seed, s.name);
    for (int64_t i = 0; i < s.numel(); ++i) p[i] = static_cast<T>(s.init_std * rng.normal());
  }
}

// The 12 weight (W) and gradient (G) pointers of one transformer block.
template <class W>
struct BlockTensors {
  W *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  W *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

}  // namespace mpiformer
