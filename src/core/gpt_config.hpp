// The shape of a GPT-2 model: in core because the input deck (io) and the
// checkpoints (io) describe it as much as the model does.
#pragma once
#include <cstdint>

namespace mpiformer {

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  int64_t seq_len = 0;     // maximum context, the size of the position table
  int64_t vocab_size = 0;  // real tokens

  // The LM head and embedding are padded to a multiple of 128 rows per
  // tensor rank (tp ranks each hold padded_vocab(tp) / tp of them) so the
  // largest GEMM of the model has a friendly shape on every rank; the
  // padding is never visible outside the model (checkpoints and logits use
  // vocab_size).
  int64_t padded_vocab(int64_t tp = 1) const {
    const int64_t m = 128 * tp;
    return (vocab_size + m - 1) / m * m;
  }
  int64_t head_dim() const { return n_embd / n_head; }
};

}  // namespace mpiformer
