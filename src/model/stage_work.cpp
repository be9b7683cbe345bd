#include "model/stage_work.hpp"

#include <algorithm>
#include <cmath>

#include "model/moe_plan.hpp"

namespace mpiformer {

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kMatmul: return "matmul";
    case Kernel::kAttention: return "attention";
    case Kernel::kLayernorm: return "layernorm";
    case Kernel::kGelu: return "gelu";
    case Kernel::kResidual: return "residual";
    case Kernel::kCrossentropy: return "crossentropy";
    case Kernel::kEmbedding: return "embedding";
  }
  return "?";
}

int kernel_arrays(Kernel k, bool backward) {
  switch (k) {
    case Kernel::kLayernorm: return backward ? 4 : 2;  // dout, inp, dinp (+=): in and out
    case Kernel::kGelu: return backward ? 3 : 2;
    case Kernel::kResidual: return 3;
    case Kernel::kCrossentropy: return 3;  // logits read twice, the gradient written
    case Kernel::kEmbedding: return backward ? 5 : 3;  // rows read and added into
    default: return 0;  // matmul, attention: priced by shape
  }
}

std::string kernel_rate_name(Kernel k, bool backward) {
  const bool has_backward = k == Kernel::kLayernorm || k == Kernel::kGelu || k == Kernel::kEmbedding;
  return std::string(kernel_name(k)) + (backward && has_backward ? "_backward" : "");
}

namespace {

struct Builder {
  std::vector<WorkItem>* out;
  double act;
  // The bytes a matmul moves at least (what bounds a small one): forward,
  // the input, the weight and the output; backward, the output gradient
  // twice, the weight, the input, the input gradient, and the float weight
  // gradient read and written.
  void matmul(bool bwd, int64_t m, int64_t k, int64_t n) {
    const double M = static_cast<double>(m), K = static_cast<double>(k), N = static_cast<double>(n);
    const double f = 2.0 * M * K * N;
    const double bytes =
        bwd ? act * (2 * M * N + 2 * M * K + K * N) + 8 * K * N : act * (M * K + K * N + M * N);
    out->push_back({Kernel::kMatmul, bwd, m, k, n, 0, bytes, bwd ? 2 * f : f});
  }
  // A backward's halves, as split backward runs them: the input gradient
  // (the output gradient, the weight, the input gradient) and the weight
  // gradient (the output gradient, the input, the float weight gradient
  // read and written); each half the FLOPs.
  void matmul_input_grad(int64_t m, int64_t k, int64_t n) {
    const double M = static_cast<double>(m), K = static_cast<double>(k), N = static_cast<double>(n);
    out->push_back({Kernel::kMatmul, true, m, k, n, 0, act * (M * N + K * N + M * K), 2 * M * K * N});
  }
  void matmul_weight_grad(int64_t m, int64_t k, int64_t n) {
    const double M = static_cast<double>(m), K = static_cast<double>(k), N = static_cast<double>(n);
    out->push_back({Kernel::kMatmul, true, m, k, n, 0, act * (M * N + M * K) + 8 * K * N, 2 * M * K * N});
  }
  // Scores and values of every (batch, head) pair over the full T x T
  // (both devices compute the masked half too; FLOPs count as MFU does,
  // 2 products forward, 4 backward).
  void attention(bool bwd, int64_t bh, int64_t hs, int64_t T, bool unmasked = false) {
    const double f = 4.0 * static_cast<double>(bh) * static_cast<double>(T) *
                     static_cast<double>(T) * static_cast<double>(hs);
    out->push_back({Kernel::kAttention, bwd, bh, hs, T, 0, 0, bwd ? 2 * f : f, unmasked});
  }
  // An elementwise kernel over `elements`.
  void stream(Kernel k, bool bwd, double elements) {
    out->push_back({k, bwd, 0, 0, 0, elements, elements * kernel_arrays(k, bwd) * act, 0});
  }
  // A copy (2 arrays) or fill (1) of `elements`, priced as the residual add.
  void move(double elements, double arrays) {
    out->push_back({Kernel::kResidual, false, 0, 0, 0, elements, elements * arrays * act, 0});
  }
};

}  // namespace

StageWork stage_work(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                     Recompute recompute, double act_bytes, bool sequence_parallel,
                     bool split_backward, double expert_imbalance, int64_t cp) {
  StageWork w;
  // Under context parallelism the rank's rows are a cp-th of each sequence.
  const int64_t tp = range.tp, BT = micro_batch * cfg.seq_len / cp, C = cfg.n_embd;
  const int64_t ca = C / tp, cqkv = cfg.qkv_dim_per_rank(tp), cm = cfg.ffn() / tp;
  const int64_t cin = cfg.ffn_in() / tp, nh = cfg.n_head / tp;
  // Llama's rotary positions: q and k read and written once each way.
  const double rotated = cfg.llama() ? static_cast<double>(BT * (cqkv - cfg.kv_dim_per_rank(tp))) : 0;
  const int64_t vl = cfg.padded_vocab(tp) / tp, L = range.num_layers();
  const bool sp = sequence_parallel && tp > 1;
  const double btc = static_cast<double>(BT * C);
  // The residual stream's elements held: the rows' tp-th under sequence
  // parallelism (LayerNorms and residual adds run on them).
  const double rc = sp ? btc / static_cast<double>(tp) : btc;
  const double whole = btc * act_bytes;
  w.message_bytes = rc * act_bytes;
  Builder f{&w.forward, act_bytes}, b{&w.backward, act_bytes}, wg{&w.weights, act_bytes};
  const bool split = split_backward;
  using TC = TensorCollective;
  auto group = [&](std::vector<TC>& list, TC::Kind kind, double bytes) {
    if (tp > 1) list.push_back({kind, bytes});
  };
  // gpt_stage_impl.hpp's gathered / summed / summed_input_grad.
  auto gather = [&](std::vector<TC>& list) {
    if (sp) group(list, TC::kAllgather, whole);
  };
  auto sum = [&](std::vector<TC>& list) {
    group(list, sp ? TC::kReduceScatter : TC::kAllreduce, whole);
  };
  // The LayerNorms' weight gradients from the rows held (4-byte Acc);
  // split, W sums the blocks'.
  auto ln_grads = [&](int layernorms, bool in_w) {
    if (sp)
      group(in_w ? w.tp_weights : w.tp_backward, TC::kAllreduce,
            2.0 * layernorms * static_cast<double>(C) * 4);
  };
  // A backward GEMM whose input `gathers_input` (its dW reads the gathered
  // rows): whole, or B's input-gradient half and W's weight-gradient half
  // (where W gathers its input, and `dout_rows` its output gradient again).
  auto matmul_backward = [&](int64_t m, int64_t k, int64_t n, bool gathers_input, bool dout_rows) {
    if (!split) {
      if (gathers_input) gather(w.tp_backward);
      b.matmul(true, m, k, n);
      return;
    }
    b.matmul_input_grad(m, k, n);
    if (gathers_input || dout_rows) gather(w.tp_weights);
    wg.matmul_weight_grad(m, k, n);
  };
  // A sparse block's MLP (gpt_stage_impl.hpp's moe_forward, moe_backward):
  // the router's GEMM and kernel, the dispatch, each expert's two GEMMs on
  // its rows (priced balanced: BT k / E rows each, fewer where a capacity
  // caps them), the combine; backward the same way round, with the gates'
  // gradients summed over the tensor group and the dispatch done again.
  // Under expert parallelism each rank's E / ep experts take every rank's
  // rows routed to them (ep times a balanced expert's, times the
  // imbalance: this is the group's busiest rank), and four all-to-alls
  // move them (out and back, then their gradients: the busiest rank's
  // rows); ep 1 dispatches ln2's rows again in backward instead (there
  // imbalance moves rows between experts, not between ranks).
  const int64_t E = cfg.experts, K = cfg.top_k, ep = range.ep, local = ep > 0 ? E / ep : E;
  const int64_t cap = cfg.expert_capacity(cfg.seq_len);
  // (Under context parallelism a rank's balanced share of a capacity is
  // its cp-th.)
  const int64_t per_expert =
      E > 0 ? (cap > 0 ? std::min(BT * K / E, micro_batch * cap / cp) : BT * K / E) : 0;
  const double routed = static_cast<double>(E * per_expert);  // rows dispatched
  int64_t expert_rows = ep * per_expert;  // each of this rank's experts
  if (ep > 1 && expert_imbalance > 1) {
    const MoePlan moe = moe_plan(cfg, range, micro_batch, cp);
    expert_rows = std::min(static_cast<int64_t>(std::ceil(static_cast<double>(expert_rows) * expert_imbalance)),
                           moe.received / local);
  }
  const double received = static_cast<double>(expert_rows * local);  // rows this rank's experts take
  const double exchanged = (ep > 1 ? received : routed) * static_cast<double>(C) * act_bytes;
  auto moe_forward = [&](Builder& x) {
    x.matmul(false, BT, C, E);
    x.stream(Kernel::kGelu, false, static_cast<double>(BT * E));  // softmax, top k, capacity
    x.move(routed * static_cast<double>(C), 2);                   // dispatch
    if (ep > 1) (x.out == &w.forward ? w.ep_forward : w.ep_backward).push_back(exchanged);
    for (int64_t e = 0; e < local; ++e) x.matmul(false, expert_rows, C, cin);
    x.stream(Kernel::kGelu, false, received * static_cast<double>(cin));
    for (int64_t e = 0; e < local; ++e) x.matmul(false, expert_rows, cm, C);
    if (ep > 1) (x.out == &w.forward ? w.ep_forward : w.ep_backward).push_back(exchanged);
    x.move(routed * static_cast<double>(C), 2);  // combine
  };
  // Split: B keeps the logits' and the experts' output gradients for W
  // (two copies), W gathers and dispatches ln2's rows again.
  auto moe_backward = [&]() {
    b.move(routed * static_cast<double>(C), 3);  // combine: rows and gates
    group(w.tp_backward, TC::kAllreduce, static_cast<double>(BT * K) * 4);
    b.stream(Kernel::kGelu, true, static_cast<double>(BT * E));  // the router's
    if (split) b.move(static_cast<double>(BT * E), 2);
    if (ep > 1) w.ep_backward.push_back(exchanged);
    for (int64_t e = 0; e < local; ++e) matmul_backward(expert_rows, cm, C, false, false);
    if (split) b.move(received * static_cast<double>(C), 2);
    b.stream(Kernel::kGelu, true, received * static_cast<double>(cin));
    matmul_backward(BT, C, E, true, false);  // ln2 (the router's)
    if (ep == 1) (split ? wg : b).move(routed * static_cast<double>(C), 2);  // dispatched again
    for (int64_t e = 0; e < local; ++e) matmul_backward(expert_rows, C, cin, false, false);
    if (ep > 1) w.ep_backward.push_back(exchanged);
    b.move(routed * static_cast<double>(C), 2);  // the dispatch's backward
  };
  // Attention: over the whole sequence, or (cp > 1) the ring's blocks of
  // T / (2 cp) queries and keys, 2 cp + 1 of them per rank and head (its
  // two chunks each see the chunks up to their own; train/ring_attention.hpp
  // skips the rest): two on the diagonal, causal, the rest unmasked. Each
  // pass sends key/value blocks of B T / cp rows of the kv width (in the
  // activations' type) round the ring, cp - 1 of them; backward, with
  // each its gradients' sums in float, and the sums' trip home.
  const int64_t n_ring = cfg.seq_len / (2 * cp);
  const double kv_rows = static_cast<double>(BT * 2 * cfg.kv_dim_per_rank(tp));
  const double kv_block = kv_rows * act_bytes, sums_block = kv_rows * 4;
  if (cp > 1) w.cp_block_bytes = kv_block, w.cp_sums_bytes = sums_block;
  auto attention = [&](Builder& x, bool bwd, std::vector<StageWork::RingPass>& ring) {
    if (cp == 1) {
      x.attention(bwd, micro_batch * nh, cfg.head_dim(), cfg.seq_len);
      return;
    }
    x.attention(bwd, micro_batch * nh * 2, cfg.head_dim(), n_ring);
    x.attention(bwd, micro_batch * nh * (2 * cp - 1), cfg.head_dim(), n_ring, true);
    ring.push_back({static_cast<double>(cp - 1), bwd ? static_cast<double>(cp) : 0.0});
  };
  // forward_block: into `x`'s list (the forward, or a backward recomputing it).
  auto block_forward = [&](Builder& x, std::vector<TC>& comm, std::vector<StageWork::RingPass>& ring, bool sparse) {
    x.stream(Kernel::kLayernorm, false, rc);
    gather(comm);
    x.matmul(false, BT, C, cqkv);
    if (rotated > 0) x.move(rotated, 2);
    attention(x, false, ring);
    x.matmul(false, BT, ca, C);
    sum(comm);
    x.stream(Kernel::kResidual, false, rc);
    x.stream(Kernel::kLayernorm, false, rc);
    gather(comm);
    if (sparse) {
      moe_forward(x);
    } else {
      x.matmul(false, BT, C, cin);
      x.stream(Kernel::kGelu, false, static_cast<double>(BT * cin));  // GELU, or SwiGLU
      x.matmul(false, BT, cm, C);
    }
    sum(comm);
    x.stream(Kernel::kResidual, false, rc);
  };
  if (range.has_embedding) {
    f.stream(Kernel::kEmbedding, false, btc);  // token row, position row, out
    if (sp) {
      sum(w.tp_forward);
    } else if (tp > 1) {
      // Each rank's token rows gathered, then moved to their positions
      // (priced as one more pass of the embedding's traffic).
      group(w.tp_forward, TC::kAllgather, whole);
      f.stream(Kernel::kEmbedding, false, btc);
    }
  }
  w.blocks_begin[0] = w.forward.size();
  for (int64_t i = 0; i < L; ++i)
    block_forward(f, w.tp_forward, w.cp_forward, cfg.moe_layer(range.layer(i)));
  w.blocks_end[0] = w.forward.size();
  if (range.has_head) {
    const double logits = static_cast<double>(BT * vl);
    f.stream(Kernel::kLayernorm, false, rc);
    gather(w.tp_forward);
    f.matmul(false, BT, C, vl);
    // The loss and its gradient in one kernel (training): read the logits
    // twice (max, sum), write the gradient once.
    f.stream(Kernel::kCrossentropy, false, logits);
    group(w.tp_forward, TC::kAllreduce, static_cast<double>(BT) * 4);      // row maxima
    group(w.tp_forward, TC::kAllreduce, static_cast<double>(2 * BT) * 4);  // sums, target logits
    // Backward of the head (whole, also when split: gpt_stage.hpp's logits_of).
    gather(w.tp_backward);
    b.matmul(true, BT, C, vl);
    sum(w.tp_backward);
    b.move(rc, 1);  // dres zeroed
    b.stream(Kernel::kLayernorm, true, rc);
    ln_grads(1, false);
  } else {
    b.move(rc, 2);  // the received gradient copied in
  }
  w.blocks_begin[1] = w.backward.size();
  w.blocks_begin[2] = w.weights.size();
  for (int64_t i = 0; i < L; ++i) {
    const bool sparse = cfg.moe_layer(range.layer(i));
    if (recompute == Recompute::kFull) block_forward(b, w.tp_backward, w.cp_backward, sparse);
    if (split) b.move(rc, 2);  // dres kept for W
    gather(w.tp_backward);  // dres
    if (sparse) {
      moe_backward();
    } else {
      matmul_backward(BT, cm, C, false, true);
      b.stream(Kernel::kGelu, true, static_cast<double>(BT * cin));
      matmul_backward(BT, C, cin, true, false);  // ln2
    }
    sum(w.tp_backward);
    b.stream(Kernel::kLayernorm, true, rc);
    if (split) b.move(rc, 2);  // dres kept for W
    gather(w.tp_backward);  // dres
    matmul_backward(BT, ca, C, false, true);
    if (recompute == Recompute::kAttention) attention(b, false, w.cp_backward);
    attention(b, true, w.cp_backward);
    if (rotated > 0) b.move(rotated, 2);
    if (split) b.move(static_cast<double>(BT * cqkv), 2);  // dqkv kept for W
    matmul_backward(BT, C, cqkv, true, false);  // ln1
    sum(w.tp_backward);
    b.stream(Kernel::kLayernorm, true, rc);
    ln_grads(2, split);
  }
  w.blocks_end[1] = w.backward.size();
  w.blocks_end[2] = w.weights.size();
  if (range.has_embedding) {
    if (split) b.move(rc, 2);  // dres kept for W
    auto& list = split ? w.tp_weights : w.tp_backward;
    gather(list);  // dres: any row may hold this rank's tokens
    (split ? wg : b).stream(Kernel::kEmbedding, true, btc);
  }
  return w;
}

}  // namespace mpiformer
