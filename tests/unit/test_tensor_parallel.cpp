// Tensor parallelism in double precision, each rank of the world one
// tensor rank (run at 2 and 4 ranks), against the unsplit computation done
// on every rank alone: the vocabulary-parallel cross-entropy, the column-
// and row-parallel linears with their backward conjugates, and the whole
// stage (the same initial values, losses, every gradient slice and the
// input gradient), with and without sequence parallelism. The group's sums are the real MPI communicator's.
// Tolerance: double rounding only (the split sums associate differently),
// |err| <= 1e-12 + 1e-9 |want|; a misplaced slice or a missing all-reduce
// is wrong by O(1).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "host/crossentropy.hpp"
#include "host/matmul.hpp"
#include "model/gpt_stage.hpp"
#include "parallel/mpi_communicator.hpp"
#include "reference.hpp"
#include "train/expert_group.hpp"
#include "train/tensor_group.hpp"

namespace mpiformer::test {
namespace {

constexpr double kAbs = 1e-12, kRel = 1e-9;

struct World {
  MpiCommunicator comm;
  World() : comm(dup()) {}
  static MPI_Comm dup() {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    return c;
  }
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  TensorGroup group() { return tensor_group(comm); }
  void sum(std::vector<double>& v) { comm.allreduce(v.data(), static_cast<int64_t>(v.size()), Element::kF64, Reduction::kSum); }
};

// Columns [c0, c0 + w) of a row-major [rows, cols] matrix.
std::vector<double> columns(const std::vector<double>& m, int64_t cols, int64_t c0, int64_t w) {
  const int64_t rows = static_cast<int64_t>(m.size()) / cols;
  std::vector<double> out(static_cast<size_t>(rows * w));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(m.data() + r * cols + c0, w, out.data() + r * w);
  return out;
}

TEST(TensorParallel, VocabularyParallelCrossEntropyEqualsTheWholeOne) {
  World w;
  const int tp = w.size(), r = w.rank();
  // 300 real tokens, padded to a multiple of 128 tp: ranks hold 256 or 128
  // columns each, the last ones fewer real tokens or none.
  const int64_t N = 24, V = 300, Vp = (V + 128 * tp - 1) / (128 * tp) * (128 * tp), Vl = Vp / tp;
  const int64_t v0 = r * Vl, real = std::clamp(V - v0, int64_t{0}, Vl);
  auto logits = random_vector(static_cast<size_t>(N * Vp), 11, 3.0);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = static_cast<int32_t>((n * 97 + 5) % V);
  const double scale = 1.0 / 64;
  std::vector<double> want_losses(N), want_grad = logits;
  host::crossentropy_forward_backward(want_losses.data(), want_grad.data(), targets.data(), N, V,
                                      Vp, scale);
  // This rank's columns; the padding holds garbage, which must not count.
  auto mine = columns(logits, Vp, v0, Vl);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = real; i < Vl; ++i) mine[n * Vl + i] = 1e3;
  std::vector<double> rowmax(N), stats(2 * N), losses(N);
  host::crossentropy_vp_max(rowmax.data(), mine.data(), N, real, Vl);
  w.comm.allreduce(rowmax.data(), N, Element::kF64, Reduction::kMax);
  host::crossentropy_vp_sums(stats.data(), mine.data(), targets.data(), rowmax.data(), N, real, Vl,
                             v0);
  w.sum(stats);
  host::crossentropy_vp_finish(losses.data(), mine.data(), targets.data(), rowmax.data(),
                               stats.data(), N, real, Vl, v0, scale, true);
  EXPECT_TRUE(all_close(losses, want_losses, kAbs, kRel));
  EXPECT_TRUE(all_close(mine, columns(want_grad, Vp, v0, Vl), kAbs, kRel));
}

// Megatron's pair on [N, C] -> [N, OC]: column-parallel (W's rows split,
// the output's columns local, the input gradient summed) and row-parallel
// (W's columns and the input's split, the output summed, the bias added
// once, the input gradient local).
TEST(TensorParallel, ParallelLinearsAndTheirBackwardEqualTheWholeOnes) {
  World w;
  const int tp = w.size(), r = w.rank();
  const int64_t N = 10, C = 8 * tp, OC = 12 * tp;
  const auto x = random_vector(static_cast<size_t>(N * C), 1), W = random_vector(static_cast<size_t>(OC * C), 2);
  const auto b = random_vector(static_cast<size_t>(OC), 3), dout = random_vector(static_cast<size_t>(N * OC), 4);
  std::vector<double> y(N * OC), dx(N * C), dW(OC * C, 0.0), db(OC, 0.0);
  host::matmul_forward(y.data(), x.data(), W.data(), b.data(), N, C, OC);
  host::matmul_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, C, OC);

  // Column-parallel: rows [o0, o0 + ol) of W and b.
  const int64_t ol = OC / tp, o0 = r * ol;
  std::vector<double> Wc(W.begin() + o0 * C, W.begin() + (o0 + ol) * C), bc(b.begin() + o0, b.begin() + o0 + ol);
  const auto dout_c = columns(dout, OC, o0, ol);
  std::vector<double> yc(N * ol), dxc(N * C), dWc(ol * C, 0.0), dbc(ol, 0.0);
  host::matmul_forward(yc.data(), x.data(), Wc.data(), bc.data(), N, C, ol);
  host::matmul_backward(dxc.data(), dWc.data(), dbc.data(), dout_c.data(), x.data(), Wc.data(), N, C, ol);
  w.sum(dxc);
  EXPECT_TRUE(all_close(yc, columns(y, OC, o0, ol), kAbs, kRel));
  EXPECT_TRUE(all_close(dxc, dx, kAbs, kRel));
  EXPECT_TRUE(all_close(dWc, std::vector<double>(dW.begin() + o0 * C, dW.begin() + (o0 + ol) * C), kAbs, kRel));
  EXPECT_TRUE(all_close(dbc, std::vector<double>(db.begin() + o0, db.begin() + o0 + ol), kAbs, kRel));

  // Row-parallel: columns [c0, c0 + cl) of W and of the input.
  const int64_t cl = C / tp, c0 = r * cl;
  const auto Wr = columns(W, C, c0, cl), xr = columns(x, C, c0, cl);
  std::vector<double> yr(N * OC), dxr(N * cl), dWr(OC * cl, 0.0), dbr(OC, 0.0);
  host::matmul_forward(yr.data(), xr.data(), Wr.data(), r == 0 ? b.data() : nullptr, N, cl, OC);
  w.sum(yr);
  host::matmul_backward(dxr.data(), dWr.data(), dbr.data(), dout.data(), xr.data(), Wr.data(), N, cl, OC);
  EXPECT_TRUE(all_close(yr, y, kAbs, kRel));
  EXPECT_TRUE(all_close(dxr, columns(dx, C, c0, cl), kAbs, kRel));
  EXPECT_TRUE(all_close(dWr, columns(dW, C, c0, cl), kAbs, kRel));
  EXPECT_TRUE(all_close(dbr, db, kAbs, kRel));
}

GptConfig config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.seq_len = 8;
  c.vocab_size = 300;
  return c;
}

// A tensor's slice as `spec` describes it, cut from the whole tensor `whole`.
std::vector<double> slice_of(const ParameterSpec& spec, const double* whole) {
  std::vector<double> out(static_cast<size_t>(spec.numel()));
  const int64_t width = spec.logical_shape.size() > 1 ? spec.logical_shape[1] : 1;
  for (const LogicalBox& b : spec.boxes(0, spec.shape[0]))
    for (int64_t i = 0; i < b.rows; ++i)
      std::copy_n(whole + (b.row + i) * width + b.col, b.cols, out.data() + (b.local_row + i) * b.cols);
  return out;
}

// The whole stage at tp = world size against the unsplit stage, for the
// whole model and for a last stage without the embedding (whose input
// gradient must be the unsplit one); plain, and under sequence parallelism
// (where a rank's input and input gradient are its rows of the unsplit
// ones, and its LayerNorms' gradients come from its rows and the group's
// sum), with each recomputation.
void expect_stage_equals_whole_stage(bool sequence_parallel, Recompute recompute,
                                     bool split_backward = false, const GptConfig& cfg = config()) {
  World w;
  const int64_t B = 2, BT = B * cfg.seq_len, C = cfg.n_embd;
  // The rows this rank holds of the residual stream.
  const int64_t rows = sequence_parallel ? BT / w.size() : BT;
  const int64_t first_row = sequence_parallel ? rows * w.rank() : 0;
  StageOptions options{B, 1};
  options.recompute = recompute;
  for (const StageRange& whole : {StageRange{0, 2, true, true}, StageRange{1, 2, false, true}}) {
    StageRange split = whole;
    split.tp = w.size();
    split.tp_rank = w.rank();
    host::Context c1, c2;
    GptStage<host::Ops<double>> ref(c1, cfg, whole, options);
    options.sequence_parallel = sequence_parallel;
    options.split_backward = split_backward;
    GptStage<host::Ops<double>> tp(c2, cfg, split, options);
    options.sequence_parallel = options.split_backward = false;
    ASSERT_EQ(tp.activation_size(), rows * C);
    tp.set_tensor_group(w.group());
    ref.init_parameters(5);
    tp.init_parameters(5);
    ref.zero_grads();
    tp.zero_grads();
    std::vector<int32_t> tok(BT), tgt(BT);
    for (int64_t i = 0; i < BT; ++i) {
      tok[i] = static_cast<int32_t>((i * 131 + 7) % cfg.vocab_size);  // every rank's rows
      tgt[i] = static_cast<int32_t>((i * 89 + 2) % cfg.vocab_size);
    }
    const auto input = random_vector(static_cast<size_t>(BT * cfg.n_embd), 9);
    if (!whole.has_embedding) {
      std::copy(input.begin(), input.end(), ref.input_buffer(0));
      std::copy_n(input.begin() + first_row * C, rows * C, tp.input_buffer(0));
    }
    // Evaluation's forward, then training's.
    ref.forward(0, tok.data(), tgt.data(), false, 0.0);
    tp.forward(0, tok.data(), tgt.data(), false, 0.0);
    EXPECT_NEAR(tp.take_loss_sum(), ref.take_loss_sum(), 1e-9);
    ref.forward(0, tok.data(), tgt.data(), true, 1.0 / static_cast<double>(BT));
    tp.forward(0, tok.data(), tgt.data(), true, 1.0 / static_cast<double>(BT));
    EXPECT_NEAR(tp.take_loss_sum(), ref.take_loss_sum(), 1e-9);
    // Every rank routes as the whole stage does (a Mixture of Experts).
    double rt[kRouterTotals] = {}, tt[kRouterTotals] = {};
    std::vector<double> rl(static_cast<size_t>(cfg.n_layer * cfg.experts)), tl(rl.size());
    ref.take_router_stats(rt, rl.data());
    tp.take_router_stats(tt, tl.data());
    for (int k = 0; k < kRouterTotals; ++k) EXPECT_NEAR(tt[k], rt[k], 1e-9 * (1 + std::fabs(rt[k])));
    EXPECT_EQ(tl, rl);
    ref.backward(0);
    tp.backward(0);
    if (split_backward) tp.weight_gradients(0);
    for (const auto& spec : tp.table().specs()) {
      const ParameterSpec& full = ref.table().at(spec.name);
      const std::vector<double> p(tp.params() + spec.offset, tp.params() + spec.offset + spec.numel());
      const std::vector<double> g(tp.grads() + spec.offset, tp.grads() + spec.offset + spec.numel());
      ASSERT_EQ(p, slice_of(spec, ref.params() + full.offset)) << spec.name << ": initial values";
      EXPECT_TRUE(all_close(g, slice_of(spec, ref.grads() + full.offset), kAbs, kRel)) << spec.name;
    }
    if (!whole.has_embedding) {
      const std::vector<double> want(ref.input_grad() + first_row * C,
                                     ref.input_grad() + (first_row + rows) * C);
      const std::vector<double> got(tp.input_grad(), tp.input_grad() + rows * C);
      EXPECT_TRUE(all_close(got, want, kAbs, kRel)) << "input gradient";
    }
  }
}

TEST(TensorParallel, TheStageEqualsTheWholeStage) {
  expect_stage_equals_whole_stage(false, Recompute::kNone);
}

TEST(TensorParallel, SequenceParallelStageEqualsTheWholeStage) {
  for (const Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    SCOPED_TRACE(name_of(r));
    expect_stage_equals_whole_stage(true, r);
  }
}

// The zero-bubble schedules' split backward under tensor parallelism: W
// gathers again the rows its GEMMs read and sums the LayerNorms' weight
// gradients over the group.
TEST(TensorParallel, SplitBackwardStageEqualsTheWholeStage) {
  for (const bool sp : {false, true}) {
    for (const Recompute r : {Recompute::kNone, Recompute::kAttention}) {
      SCOPED_TRACE(std::string(name_of(r)) + (sp ? ", sequence parallel" : ""));
      expect_stage_equals_whole_stage(sp, r, true);
    }
  }
}

// A Mixture of Experts: the router replicated, each expert's MLP split as
// the dense one; the gates' gradients summed over the group. 4 experts,
// top 2, some assignments dropped (capacity 4 of a sequence's 16).
TEST(TensorParallel, MoeStageEqualsTheWholeStage) {
  GptConfig cfg = config();
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;
  cfg.aux_loss = 0.1;
  cfg.router_z_loss = 0.01;
  expect_stage_equals_whole_stage(false, Recompute::kNone, false, cfg);
  // Sequence parallelism with split backward: W gathers ln2's rows again
  // for the router's and the experts' weight gradients.
  expect_stage_equals_whole_stage(true, Recompute::kAttention, true, cfg);
  cfg.family = ModelFamily::kLlama;
  cfg.ffn_hidden = 24;
  cfg.n_kv_head = 4;  // one per rank at tp 4 (shared heads are summed by the optimizer)
  cfg.tie_embeddings = false;
  cfg.moe_every = 2;
  expect_stage_equals_whole_stage(true, Recompute::kFull, false, cfg);
}

// Expert parallelism: the world one expert-parallel group, each rank a
// micro-batch of its own and E / ranks of the experts, which compute every
// rank's rows routed to them (MPI's all-to-all); against one stage of every
// rank's sequences with every expert: the loss and the routing summed over
// the ranks, the dense gradients summed over them (what the data-parallel
// reduction gives), each rank's experts' gradients as they are (every row
// routed to them was theirs), each rank's rows of the input gradient. A
// whole model and a last stage; the Llama family's under full
// recomputation (the exchange runs again in backward).
// `split`: the expert-parallel stage runs split backward (B, then W from
// what B kept: its experts' received rows and their output gradients).
void expect_expert_parallel_equals_whole_batch(const GptConfig& cfg, Recompute recompute,
                                               bool split = false) {
  World w;
  const int64_t P = w.size(), B = 1, BT = B * cfg.seq_len, C = cfg.n_embd;
  for (const StageRange& whole : {StageRange{0, 2, true, true}, StageRange{1, 2, false, true}}) {
    StageRange part = whole;
    part.ep = P;
    part.ep_rank = w.rank();
    StageOptions all{B * P, 1}, mine{B, 1};
    all.recompute = mine.recompute = recompute;
    mine.split_backward = split;
    host::Context c1, c2;
    GptStage<host::Ops<double>> ref(c1, cfg, whole, all);
    GptStage<host::Ops<double>> ep(c2, cfg, part, mine);
    ep.set_expert_group(expert_group(w.comm, w.comm));
    ref.init_parameters(5);
    ep.init_parameters(5);
    ref.zero_grads();
    ep.zero_grads();
    std::vector<int32_t> tok(P * BT), tgt(P * BT);
    for (int64_t i = 0; i < P * BT; ++i) {
      tok[i] = static_cast<int32_t>((i * 131 + 7) % cfg.vocab_size);
      tgt[i] = static_cast<int32_t>((i * 89 + 2) % cfg.vocab_size);
    }
    const int64_t first = w.rank() * BT;
    const auto input = random_vector(static_cast<size_t>(P * BT * C), 9);
    if (!whole.has_embedding) {
      std::copy(input.begin(), input.end(), ref.input_buffer(0));
      std::copy_n(input.begin() + first * C, BT * C, ep.input_buffer(0));
    }
    const double scale = 1.0 / static_cast<double>(P * BT);
    ref.forward(0, tok.data(), tgt.data(), true, scale);
    ep.forward(0, tok.data() + first, tgt.data() + first, true, scale);
    std::vector<double> loss = {ep.take_loss_sum()};
    w.sum(loss);
    EXPECT_NEAR(loss[0], ref.take_loss_sum(), 1e-9);
    std::vector<double> rt(kRouterTotals), et(kRouterTotals);
    std::vector<double> rl(static_cast<size_t>(cfg.n_layer * cfg.experts)), el(rl.size());
    ref.take_router_stats(rt.data(), rl.data());
    ep.take_router_stats(et.data(), el.data());
    w.sum(et);
    w.sum(el);
    EXPECT_TRUE(all_close(et, rt, kAbs, kRel)) << "the routing's totals";
    EXPECT_EQ(el, rl) << "rows per expert";
    ref.backward(0);
    ep.backward(0);
    if (split) ep.weight_gradients(0);
    int64_t experts_checked = 0;
    for (const auto& spec : ep.table().specs()) {
      const ParameterSpec& full = ref.table().at(spec.name);
      std::vector<double> g(ep.grads() + spec.offset, ep.grads() + spec.offset + spec.numel());
      if (spec.expert < 0) w.sum(g);  // a dense tensor: every rank's share of the batch
      else ++experts_checked;
      const std::vector<double> want(ref.grads() + full.offset, ref.grads() + full.offset + full.numel());
      EXPECT_TRUE(all_close(g, want, kAbs, kRel)) << spec.name;
    }
    bool sparse = false;
    for (int64_t l = whole.first_layer; l < whole.last_layer; ++l) sparse = sparse || cfg.moe_layer(l);
    EXPECT_EQ(experts_checked > 0, sparse);
    if (!whole.has_embedding) {
      const std::vector<double> want(ref.input_grad() + first * C, ref.input_grad() + (first + BT) * C);
      const std::vector<double> got(ep.input_grad(), ep.input_grad() + BT * C);
      EXPECT_TRUE(all_close(got, want, kAbs, kRel)) << "input gradient";
    }
  }
}

TEST(ExpertParallel, StageEqualsTheWholeBatch) {
  GptConfig cfg = config();
  cfg.experts = 4;  // 2 or 1 per rank
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;  // some assignments dropped
  cfg.aux_loss = 0.1;
  cfg.router_z_loss = 0.01;
  expect_expert_parallel_equals_whole_batch(cfg, Recompute::kNone);
  expect_expert_parallel_equals_whole_batch(cfg, Recompute::kAttention, true);
  cfg.family = ModelFamily::kLlama;
  cfg.ffn_hidden = 24;
  cfg.n_kv_head = 2;
  cfg.tie_embeddings = false;
  cfg.moe_every = 2;
  cfg.capacity_factor = 0;
  expect_expert_parallel_equals_whole_batch(cfg, Recompute::kFull);
}

}  // namespace
}  // namespace mpiformer::test
