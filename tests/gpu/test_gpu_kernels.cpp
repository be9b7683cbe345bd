// Every CUDA kernel against its host twin, in fp32, bf16 and fp16, on random
// inputs. The reference is the host kernel run in double on the very values
// the GPU received (inputs rounded to bf16 first in the bf16 case), and every
// GPU output is poisoned with NaN before the call, so an element the kernel
// fails to write fails the comparison.
//
// Tolerances, |got - want| <= tol * (1 + |want|):
//  * fp32: 1e-5. Float accumulation over at most a few hundred terms, and
//    the fast exp (__expf, 2 ulp) in the softmaxes.
//  * bf16: 1e-2 for single ops (outputs rounded to 8 significant bits,
//    2^-8 = 3.9e-3, plus float accumulation of bf16 products); 3e-2 for
//    attention's backward, which stores the probabilities and dS in bf16
//    between its four products.
//  * fp16: the bf16 bounds (its 11 significant bits round 8x finer, and
//    the inputs here stay far inside its range).
// Without a GPU the test exits 77 (gpu_test_main.cpp), which CTest reports
// as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_storage.hpp"
#include "cuda/adamw.hpp"
#include "cuda/attention.hpp"
#include "cuda/column_sum_slices.hpp"
#include "cuda/crossentropy.hpp"
#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "cuda/embedding.hpp"
#include "cuda/gelu.hpp"
#include "cuda/grad_compression.hpp"
#include "cuda/layernorm.hpp"
#include "cuda/matmul.hpp"
#include "cuda/moe_dispatch.hpp"
#include "cuda/moe_router.hpp"
#include "cuda/reduce.hpp"
#include "cuda/residual.hpp"
#include "cuda/ring_attention.hpp"
#include "cuda/rmsnorm.hpp"
#include "cuda/rope.hpp"
#include "cuda/swiglu.hpp"
#include "host/adamw.hpp"
#include "host/attention.hpp"
#include "host/attention_blocks.hpp"
#include "host/crossentropy.hpp"
#include "host/embedding.hpp"
#include "host/grad_compression.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"
#include "host/moe_dispatch.hpp"
#include "host/moe_router.hpp"
#include "host/residual.hpp"
#include "host/rmsnorm.hpp"
#include "host/rope.hpp"
#include "host/swiglu.hpp"
#include "../unit/reference.hpp"

namespace mpiformer::test {
namespace {

using cuda::bf16;
using cuda::fp16;

double to_double(float x) { return x; }
double to_double(double x) { return x; }
double to_double(bf16 x) { return __bfloat162float(x); }
double to_double(fp16 x) { return __half2float(x); }
template <class A>
A from_double(double x) {
  if constexpr (std::is_same_v<A, bf16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
  } else if constexpr (std::is_same_v<A, fp16>) {
    return __float2half_rn(static_cast<float>(x));
  } else {
    return static_cast<A>(x);
  }
}

// A device array of A mirrored by the double values it holds exactly.
template <class A>
struct Dev {
  cuda::DeviceBuffer<A> buf;
  std::vector<double> exact;  // what the device holds, as doubles
  explicit Dev(const std::vector<double>& v) : buf(v.size()), exact(v.size()) {
    std::vector<A> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = from_double<A>(v[i]);
      exact[i] = to_double(h[i]);
    }
    cuda::copy_to_device(buf.get(), h.data(), h.size() * sizeof(A));
  }
  static Dev poisoned(size_t n) { return Dev(std::vector<double>(n, std::nan(""))); }
  A* get() { return buf.get(); }
  std::vector<double> read() const {
    std::vector<A> h(buf.size());
    cuda::copy_to_host(h.data(), buf.get(), h.size() * sizeof(A));
    std::vector<double> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = to_double(h[i]);
    return out;
  }
};

std::vector<float> floats(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> doubles(const std::vector<float>& x) { return {x.begin(), x.end()}; }

template <class A>
double tol(double fp32, double bf) {
  return std::is_same_v<A, float> ? fp32 : bf;
}

::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& want,
                                 double t) {
  return all_close(got, want, t, t);
}

template <class A>
class GpuKernels : public ::testing::Test {};
using Types = ::testing::Types<float, bf16, fp16>;
TYPED_TEST_SUITE(GpuKernels, Types);

constexpr int64_t B = 2, T = 16, C = 32, NH = 4, V = 100, Vp = 128;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  // A small range so tokens repeat: the backward's grouping is exercised.
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab / 4));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(gen);
  return t;
}

// Positions of documents packed into B windows of T ([data]
// document_mask): starts at varying strides per window, a one-token
// document, and one at a 64-row tile boundary where T allows.
std::vector<int32_t> document_positions(int64_t Bn, int64_t Tn) {
  std::vector<int32_t> pos(static_cast<size_t>(Bn * Tn));
  for (int64_t b = 0; b < Bn; ++b) {
    int64_t start = 0;
    for (int64_t t = 0; t < Tn; ++t) {
      if (t > 0 && (t % (23 + 18 * b) == 0 || t == 64 || t == 65)) start = t;
      pos[static_cast<size_t>(b * Tn + t)] = static_cast<int32_t>(t - start);
    }
  }
  return pos;
}

struct DevTokens {
  cuda::DeviceBuffer<int32_t> buf;
  explicit DevTokens(const std::vector<int32_t>& t) : buf(t.size()) {
    cuda::copy_to_device(buf.get(), t.data(), t.size() * 4);
  }
};

TYPED_TEST(GpuKernels, Embedding) {
  using A = TypeParam;
  const auto tok = random_tokens(B * T, V, 1);
  Dev<A> wte(random_vector(Vp * C, 2)), wpe(random_vector(T * C, 3)), out = Dev<A>::poisoned(B * T * C);
  DevTokens dtok(tok);
  // A vocabulary slice (tensor parallelism): tokens outside it give zeros.
  // random_tokens draws from [0, V / 4]: the slice holds some of them.
  const int64_t v0 = V / 8, rows = V / 2;
  cuda::embedding_forward(out.get(), dtok.buf.get(), wte.get(), wpe.get(), B, T, C, v0, rows,
                          nullptr);
  std::vector<double> want(B * T * C);
  host::embedding_forward(want.data(), tok.data(), wte.exact.data(), wpe.exact.data(), B, T, C, v0,
                          rows);
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-6, 1e-2)));
  cuda::embedding_forward(out.get(), dtok.buf.get(), wte.get(), wpe.get(), B, T, C, 0, Vp, nullptr);
  host::embedding_forward(want.data(), tok.data(), wte.exact.data(), wpe.exact.data(), B, T, C);
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-6, 1e-2)));
  // In two pieces of the vocabulary (ZeRO 3's, StageLayout::piece): the
  // second leaves the first's rows as they were; together the whole.
  Dev<A> halves = Dev<A>::poisoned(B * T * C);
  const int64_t cut = 16;  // the tokens are drawn from [0, V / 4]: some on each side
  cuda::embedding_forward(halves.get(), dtok.buf.get(), wte.get(), wpe.get(), B, T, C, 0, cut,
                          nullptr);
  cuda::embedding_forward(halves.get(), dtok.buf.get(), wte.get() + cut * C, wpe.get(), B, T, C, cut,
                          Vp - cut, nullptr, nullptr, true);
  EXPECT_TRUE(close(halves.read(), want, tol<A>(1e-6, 1e-2))) << "in pieces";

  // Backward: accumulates into random float gradients.
  Dev<A> dout(random_vector(B * T * C, 4));
  Dev<float> dwte(random_vector(Vp * C, 5)), dwpe(random_vector(T * C, 6));
  cuda::TokenGroups groups;
  groups.build(tok.data(), B * T);
  DevTokens gt(groups.tokens), gs(groups.starts), gp(groups.positions);
  cuda::embedding_backward(dwte.get(), dwpe.get(), dout.get(),
                           cuda::DeviceTokenGroups{gt.buf.get(), gs.buf.get(), gp.buf.get(),
                                                   static_cast<int64_t>(groups.tokens.size())},
                           B, T, C, v0, rows, nullptr);
  auto want_wte = dwte.exact, want_wpe = dwpe.exact;
  host::embedding_backward(want_wte.data(), want_wpe.data(), dout.exact.data(), tok.data(), B, T, C,
                           v0, rows);
  EXPECT_TRUE(close(dwte.read(), want_wte, 1e-5));
  EXPECT_TRUE(close(dwpe.read(), want_wpe, 1e-5));

  // Documents: positions restart, wpe's rows summed by position.
  const auto pos = document_positions(B, T);
  DevTokens dpos(pos);
  cuda::embedding_forward(out.get(), dtok.buf.get(), wte.get(), wpe.get(), B, T, C, 0, Vp, nullptr,
                          dpos.buf.get());
  host::embedding_forward(want.data(), tok.data(), wte.exact.data(), wpe.exact.data(), B, T, C, 0,
                          host::kWholeVocabulary, pos.data());
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-6, 1e-2))) << "positions";
  cuda::TokenGroups by_position;
  by_position.build(pos.data(), B * T);
  DevTokens pt(by_position.tokens), ps(by_position.starts), pp(by_position.positions);
  const cuda::DeviceTokenGroups pgroups{pt.buf.get(), ps.buf.get(), pp.buf.get(),
                                        static_cast<int64_t>(by_position.tokens.size())};
  want_wte = dwte.read();  // the gradients so far, accumulated into
  want_wpe = dwpe.read();
  cuda::embedding_backward(dwte.get(), dwpe.get(), dout.get(),
                           cuda::DeviceTokenGroups{gt.buf.get(), gs.buf.get(), gp.buf.get(),
                                                   static_cast<int64_t>(groups.tokens.size())},
                           B, T, C, 0, Vp, nullptr, &pgroups);
  host::embedding_backward(want_wte.data(), want_wpe.data(), dout.exact.data(), tok.data(), B, T, C,
                           0, host::kWholeVocabulary, pos.data());
  EXPECT_TRUE(close(dwte.read(), want_wte, 1e-5)) << "positions";
  EXPECT_TRUE(close(dwpe.read(), want_wpe, 1e-5)) << "positions";
}

// The embedding by token rows (a tensor group's gather): the device's rows
// of a vocabulary slice, and the move of gathered rows to their
// positions, against the host's.
TYPED_TEST(GpuKernels, EmbeddingTokenRows) {
  using A = TypeParam;
  const auto tok = random_tokens(B * T, V, 7);
  Dev<A> wte(random_vector(Vp * C, 8)), wpe(random_vector(T * C, 9));
  // Positions whose tokens lie in the slice [v0, v0 + rows), first, then the rest.
  const int64_t v0 = V / 8, rows = V / 2;
  std::vector<int32_t> order;
  for (int32_t p = 0; p < B * T; ++p)
    if (tok[p] >= v0 && tok[p] < v0 + rows) order.push_back(p);
  const int64_t mine = static_cast<int64_t>(order.size());
  for (int32_t p = 0; p < B * T; ++p)
    if (tok[p] < v0 || tok[p] >= v0 + rows) order.push_back(p);
  DevTokens dtok(tok), dorder(order);
  Dev<A> got = Dev<A>::poisoned(mine * C);
  cuda::embedding_forward_rows(got.get(), dtok.buf.get(), dorder.buf.get(), 0, mine,
                               wte.get() + v0 * C, wpe.get(), T, C, v0, nullptr);
  std::vector<double> want(mine * C);
  host::embedding_forward_rows(want.data(), tok.data(), order.data(), 0, mine,
                               wte.exact.data() + v0 * C, wpe.exact.data(), T, C, v0);
  EXPECT_TRUE(close(got.read(), want, tol<A>(1e-6, 1e-2)));
  Dev<A> gathered(random_vector(B * T * C, 10)), out = Dev<A>::poisoned(B * T * C);
  cuda::scatter_rows(out.get(), gathered.get(), dorder.buf.get(), B * T, C, nullptr);
  std::vector<double> moved(B * T * C);
  host::scatter_rows(moved.data(), gathered.exact.data(), order.data(), B * T, C);
  EXPECT_TRUE(close(out.read(), moved, 0));
}

// N rows: B * T, or enough that the column sums cut the rows into slices
// (summed through scratch, column_sums.cuh).
template <class A>
void check_layernorm(int64_t C, int64_t N = B * T) {
  Dev<A> x(random_vector(N * C, 7, 2.0)), w(random_vector(C, 8)), b(random_vector(C, 9));
  Dev<A> out = Dev<A>::poisoned(N * C);
  Dev<float> mean = Dev<float>::poisoned(N), rstd = Dev<float>::poisoned(N);
  cuda::layernorm_forward(out.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C,
                          nullptr);
  std::vector<double> o(N * C), m(N), r(N);
  host::layernorm_forward(o.data(), m.data(), r.data(), x.exact.data(), w.exact.data(),
                          b.exact.data(), N, C);
  EXPECT_TRUE(close(out.read(), o, tol<A>(1e-5, 1e-2)));
  EXPECT_TRUE(close(mean.read(), m, 1e-5));
  EXPECT_TRUE(close(rstd.read(), r, 1e-5));

  // Backward from the statistics the reference computed (as the GPU saw them).
  Dev<A> dout(random_vector(N * C, 10)), dinp(random_vector(N * C, 11));
  Dev<float> dw(random_vector(C, 12)), db(random_vector(C, 13));
  Dev<float> mr(m), rr(r);
  cuda::DeviceBuffer<unsigned char> scratch(size_t{1} << 20);
  cuda::layernorm_backward(dinp.get(), dw.get(), db.get(), dout.get(), x.get(), w.get(), mr.get(),
                           rr.get(), N, C, cuda::DeviceScratch{scratch.get(), scratch.size()},
                           nullptr);
  auto want_dinp = dinp.exact, want_dw = dw.exact, want_db = db.exact;
  host::layernorm_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.exact.data(),
                           x.exact.data(), w.exact.data(), mr.exact.data(), rr.exact.data(), N, C);
  EXPECT_TRUE(close(dinp.read(), want_dinp, tol<A>(1e-5, 1e-2)));
  // Float sums over the rows: 1e-5 at 32 rows, scaled with the rows.
  const double t = 1e-5 * static_cast<double>(std::max<int64_t>(N, 32)) / 32;
  EXPECT_TRUE(close(dw.read(), want_dw, t));
  EXPECT_TRUE(close(db.read(), want_db, t));
}

// The norms' paths (norm_rows.cuh): 32 channels, 16-byte packs; 36, a
// whole number of packs in no type (element by element); both with the
// parameter gradients fused, and over 4 K rows (the fused sums of 264
// blocks added in order); 300 and 2056 channels, too wide to fuse (the
// column sums, element by element and in packs, over row slices).
TYPED_TEST(GpuKernels, LayerNorm) {
  check_layernorm<TypeParam>(C);
  check_layernorm<TypeParam>(36);
  check_layernorm<TypeParam>(36, 4096);
  check_layernorm<TypeParam>(300, 256);
  check_layernorm<TypeParam>(2056, 64);
  // 4 K rows of 36 columns by element: 2 column blocks, each of 64 row
  // slices.
  ASSERT_EQ(cuda::column_sum_slices(4096, 36, cuda::kSumPacks, size_t{1} << 20), 64);
}

// Llama's RMSNorm: forward and backward against the host in double.
template <class A>
void check_rmsnorm(int64_t C, int64_t N = B * T) {
  Dev<A> x(random_vector(N * C, 31, 2.0)), w(random_vector(C, 32));
  Dev<A> out = Dev<A>::poisoned(N * C);
  Dev<float> rstd = Dev<float>::poisoned(N);
  cuda::rmsnorm_forward(out.get(), rstd.get(), x.get(), w.get(), N, C, 1e-5f, nullptr);
  std::vector<double> o(N * C), r(N);
  host::rmsnorm_forward(o.data(), r.data(), x.exact.data(), w.exact.data(), N, C, 1e-5);
  EXPECT_TRUE(close(out.read(), o, tol<A>(1e-5, 1e-2)));
  EXPECT_TRUE(close(rstd.read(), r, 1e-5));
  Dev<A> dout(random_vector(N * C, 33)), dinp(random_vector(N * C, 34));
  Dev<float> dw(random_vector(C, 35)), rr(r);
  cuda::DeviceBuffer<unsigned char> scratch(size_t{1} << 20);
  cuda::rmsnorm_backward(dinp.get(), dw.get(), dout.get(), x.get(), w.get(), rr.get(), N, C,
                         cuda::DeviceScratch{scratch.get(), scratch.size()}, nullptr);
  auto want_dinp = dinp.exact, want_dw = dw.exact;
  host::rmsnorm_backward(want_dinp.data(), want_dw.data(), dout.exact.data(), x.exact.data(),
                         w.exact.data(), rr.exact.data(), N, C);
  EXPECT_TRUE(close(dinp.read(), want_dinp, tol<A>(1e-5, 1e-2)));
  EXPECT_TRUE(close(dw.read(), want_dw, 1e-5 * static_cast<double>(std::max<int64_t>(N, 32)) / 32));
}

TYPED_TEST(GpuKernels, RmsNorm) {
  check_rmsnorm<TypeParam>(C);
  check_rmsnorm<TypeParam>(36, 4096);
  check_rmsnorm<TypeParam>(300, 256);
  check_rmsnorm<TypeParam>(2056, 64);
}

// SwiGLU and rotary positions (in place on q and k of a grouped qkv).
TYPED_TEST(GpuKernels, SwiGluAndRope) {
  using A = TypeParam;
  const int64_t N = B * T, F = 24;
  Dev<A> in(random_vector(N * 2 * F, 41, 2.0)), dout(random_vector(N * F, 42));
  Dev<A> out = Dev<A>::poisoned(N * F), din = Dev<A>::poisoned(N * 2 * F);
  cuda::swiglu_forward(out.get(), in.get(), N, F, nullptr);
  std::vector<double> want(N * F), dwant(N * 2 * F);
  host::swiglu_forward(want.data(), in.exact.data(), N, F);
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-6, 1e-2)));
  cuda::swiglu_backward(din.get(), in.get(), dout.get(), N, F, nullptr);
  host::swiglu_backward(dwant.data(), in.exact.data(), dout.exact.data(), N, F);
  EXPECT_TRUE(close(din.read(), dwant, tol<A>(1e-6, 1e-2)));

  const int64_t hs = 8, Cq = 4 * hs, K = 2 * hs;  // 4 query heads, 2 kv heads
  const std::vector<float> table = host::rope_table(T, hs, 500.0);
  Dev<float> dtable(std::vector<double>(table.begin(), table.end()));
  for (const float sign : {1.f, -1.f}) {
    Dev<A> qkv(random_vector(N * (Cq + 2 * K), 43));
    auto ref = qkv.exact;
    cuda::rope_rotate(qkv.get(), dtable.get(), N, T, Cq, K, hs, sign, nullptr);
    host::rope_rotate(ref.data(), table.data(), N, T, Cq, K, hs, sign);
    EXPECT_TRUE(close(qkv.read(), ref, tol<A>(1e-6, 1e-2))) << "sign " << sign;
    // Documents: each row rotated by its position in its document.
    const auto pos = document_positions(N / T, T);
    DevTokens dpos(pos);
    Dev<A> qkv2(random_vector(N * (Cq + 2 * K), 44));
    auto ref2 = qkv2.exact;
    cuda::rope_rotate(qkv2.get(), dtable.get(), N, T, Cq, K, hs, sign, nullptr, dpos.buf.get());
    host::rope_rotate(ref2.data(), table.data(), N, T, Cq, K, hs, sign, pos.data());
    EXPECT_TRUE(close(qkv2.read(), ref2, tol<A>(1e-6, 1e-2))) << "positions, sign " << sign;
  }
}

// Mixture-of-Experts dispatch and combine: rows permuted as a router
// numbers them, a dropped assignment and a token with both dropped. The
// expert outputs' rows no assignment reaches stay poisoned: never read.
TYPED_TEST(GpuKernels, MoeDispatchAndCombine) {
  using A = TypeParam;
  const int64_t N = 5, K = 2, W = 40, M = 8;  // W channels: more than a warp
  const std::vector<int32_t> dest = {3, 0, 5, -1, 1, 6, -1, -1, 2, 4};
  DevTokens ddest(dest);
  Dev<A> x(random_vector(N * W, 91)), dy(random_vector(N * W, 92)), dx(random_vector(N * W, 93));
  std::vector<double> out_v = random_vector(M * W, 94);
  for (int64_t c = 0; c < W; ++c) out_v[7 * W + c] = std::nan("");  // row 7: unused
  Dev<A> out(out_v);
  Dev<float> gate(random_vector(N * K, 95));
  Dev<A> buf = Dev<A>::poisoned(M * W), y = Dev<A>::poisoned(N * W), dout = Dev<A>::poisoned(M * W);
  Dev<float> dgate = Dev<float>::poisoned(N * K);
  cuda::moe_dispatch_forward(buf.get(), x.get(), ddest.buf.get(), N, K, W, nullptr);
  std::vector<double> want_buf(M * W, std::nan(""));
  host::moe_dispatch_forward(want_buf.data(), x.exact.data(), dest.data(), N, K, W);
  const auto got_buf = buf.read();
  for (int64_t i = 0; i < 7 * W; ++i) EXPECT_EQ(got_buf[i], want_buf[i]) << i;  // a copy: exact
  cuda::moe_combine_forward(y.get(), out.get(), gate.get(), ddest.buf.get(), N, K, W, nullptr);
  std::vector<double> want_y(N * W);
  host::moe_combine_forward(want_y.data(), out.exact.data(), gate.exact.data(), dest.data(), N, K, W);
  EXPECT_TRUE(close(y.read(), want_y, tol<A>(1e-6, 1e-2)));
  cuda::moe_combine_backward(dout.get(), dgate.get(), dy.get(), out.get(), gate.get(),
                             ddest.buf.get(), N, K, W, nullptr);
  std::vector<double> want_dout(M * W, std::nan("")), want_dgate(N * K);
  host::moe_combine_backward(want_dout.data(), want_dgate.data(), dy.exact.data(), out.exact.data(),
                             gate.exact.data(), dest.data(), N, K, W);
  auto got_dout = dout.read();
  got_dout.resize(7 * W);
  want_dout.resize(7 * W);
  EXPECT_TRUE(close(got_dout, want_dout, tol<A>(1e-6, 1e-2)));
  EXPECT_TRUE(close(dgate.read(), want_dgate, tol<A>(1e-5, 1e-2)));
  auto want_dx = dx.exact;
  cuda::moe_dispatch_backward(dx.get(), dout.get(), ddest.buf.get(), N, K, W, nullptr);
  host::moe_dispatch_backward(want_dx.data(), dout.read().data(), dest.data(), N, K, W);
  EXPECT_TRUE(close(dx.read(), want_dx, tol<A>(1e-6, 1e-2)));
}

// The router, in float, against the host's in double on the same logits:
// every decision (choices, drops, rows, counts) exactly, the values within
// float rounding (1e-5), with a tie and experts over capacity; sequences
// of 12 assignments and of 400 (the capacity scan over 256-thread chunks).
void check_router(int64_t L, int64_t S, int64_t E, int64_t capacity) {
  SCOPED_TRACE("L " + std::to_string(L));
  const int64_t N = S * L, K = 2;
  const RouterShape r{N, L, E, K, capacity};
  std::vector<double> lv = random_vector(N * E, 96, 2.0);
  lv[4 * E + 1] = lv[4 * E + 3] = 4.0;  // a tie: expert 1 first
  Dev<float> logits(lv), probs = Dev<float>::poisoned(N * E), lse = Dev<float>::poisoned(N);
  Dev<float> gate = Dev<float>::poisoned(N * K);
  cuda::DeviceBuffer<int32_t> expert(N * K), dest(N * K), chose(S * E);
  cuda::DeviceBuffer<int64_t> kept(E);
  cuda::DeviceBuffer<double> totals(kRouterTotals);
  cuda::DeviceBuffer<char> scratch(cuda::router_scratch_bytes(r));
  const double zero[kRouterTotals] = {};
  cuda::copy_to_device(totals.get(), zero, sizeof zero);
  cuda::router_forward(r, logits.get(), probs.get(), lse.get(), expert.get(), gate.get(), dest.get(),
                       chose.get(), kept.get(), totals.get(), scratch.get(), nullptr);
  std::vector<double> hp(N * E), hl(N), hg(N * K);
  std::vector<int32_t> he(N * K), hd(N * K), hc(S * E);
  std::vector<int64_t> hk(E);
  double ht[kRouterTotals] = {};
  std::vector<int64_t> hs(host::router_scratch_bytes(r) / sizeof(int64_t));
  host::router_forward(r, logits.exact.data(), hp.data(), hl.data(), he.data(), hg.data(), hd.data(),
                       hc.data(), hk.data(), ht, hs.data());
  auto ints = [](const auto& buf, size_t n) {
    std::vector<std::remove_pointer_t<decltype(buf.get())>> v(n);
    cuda::copy_to_host(v.data(), buf.get(), n * sizeof(v[0]));
    return v;
  };
  EXPECT_EQ(ints(expert, N * K), he);
  EXPECT_EQ(he[4 * K], 1);
  EXPECT_EQ(ints(dest, N * K), hd);
  EXPECT_EQ(ints(chose, S * E), hc);
  EXPECT_EQ(ints(kept, E), hk);
  const auto t = ints(totals, kRouterTotals);
  EXPECT_GT(ht[kDropped], 0.0);
  EXPECT_EQ(t[kDropped], ht[kDropped]);
  EXPECT_NEAR(t[kAuxSum], ht[kAuxSum], 1e-5 * ht[kAuxSum]);
  EXPECT_NEAR(t[kZSum], ht[kZSum], 1e-5 * ht[kZSum]);
  EXPECT_TRUE(close(probs.read(), hp, 1e-5));
  EXPECT_TRUE(close(lse.read(), hl, 1e-5));
  EXPECT_TRUE(close(gate.read(), hg, 1e-5));
  // Backward from the same gate gradients (zero where dropped).
  std::vector<double> dg = random_vector(N * K, 97);
  for (size_t a = 0; a < dg.size(); ++a) dg[a] = hd[a] < 0 ? 0.0 : dg[a];
  Dev<float> dgate(dg), dlogits = Dev<float>::poisoned(N * E);
  cuda::router_backward(r, dlogits.get(), dgate.get(), probs.get(), lse.get(), expert.get(),
                        gate.get(), chose.get(), 0.3f, 0.01f, nullptr);
  std::vector<double> want(N * E);
  host::router_backward(r, want.data(), dgate.exact.data(), hp.data(), hl.data(), he.data(),
                        hg.data(), hc.data(), 0.3, 0.01);
  EXPECT_TRUE(close(dlogits.read(), want, 1e-5));
}

TEST(GpuRouter, MatchesTheHost) {
  check_router(6, 3, 5, 2);
  check_router(200, 2, 5, 70);
}

TYPED_TEST(GpuKernels, Matmul) {
  using A = TypeParam;
  const int64_t N = B * T, OC = 3 * C;
  cuda::Blas blas;
  Dev<A> x(random_vector(N * C, 14)), w(random_vector(OC * C, 15, 0.2)), b(random_vector(OC, 16));
  for (bool with_bias : {true, false}) {
    Dev<A> out = Dev<A>::poisoned(N * OC);
    cuda::matmul_forward(blas, out.get(), x.get(), w.get(), with_bias ? b.get() : nullptr, N, C, OC);
    std::vector<double> want(N * OC);
    host::matmul_forward(want.data(), x.exact.data(), w.exact.data(),
                         with_bias ? b.exact.data() : nullptr, N, C, OC);
    EXPECT_TRUE(close(out.read(), want, tol<A>(1e-5, 1e-2))) << "bias " << with_bias;
  }
  // Backward at B * T rows, and at 4 K rows, where the bias gradient's
  // column sums cut the rows into slices (column_sums.cuh).
  for (const int64_t rows : {N, int64_t{4096}}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    Dev<A> xr(random_vector(rows * C, 14));
    Dev<A> dout(random_vector(rows * OC, 17)), dinp = Dev<A>::poisoned(rows * C);
    Dev<float> dw(random_vector(OC * C, 18)), db(random_vector(OC, 19));
    cuda::matmul_backward(blas, dinp.get(), dw.get(), db.get(), dout.get(), xr.get(), w.get(), rows,
                          C, OC);
    std::vector<double> want_dinp(rows * C);
    auto want_dw = dw.exact, want_db = db.exact;
    host::matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.exact.data(),
                          xr.exact.data(), w.exact.data(), rows, C, OC);
    EXPECT_TRUE(close(dinp.read(), want_dinp, tol<A>(1e-5, 1e-2)));
    // Float accumulation of exact products over the rows: 1e-5 at 32 rows,
    // scaled with the rows, as the rounding bound grows (7e-5 seen at 4 K;
    // a slice of rows lost or counted twice is off by ~1).
    const double t = 1e-5 * static_cast<double>(rows) / 32;
    EXPECT_TRUE(close(dw.read(), want_dw, t));
    EXPECT_TRUE(close(db.read(), want_db, t));
  }
  // ZeRO 3's vocabulary pieces: columns [r0, r0 + cols) of the outputs
  // (rows OC apart) from that piece of the weights; the input gradient
  // added over the two pieces in float, the weight gradient per piece.
  // Against the whole product on the host (the same rounding bounds).
  const int64_t r0 = 40, cols = OC - r0;  // 8-row multiples, as pieces start
  Dev<A> dout(random_vector(N * OC, 20));
  Dev<A> out = Dev<A>::poisoned(N * OC);
  Dev<float> dx = Dev<float>::poisoned(N * C), dw(random_vector(OC * C, 21));
  for (const auto& [lo, n] : {std::pair{int64_t{0}, r0}, std::pair{r0, cols}}) {
    cuda::matmul_forward(blas, out.get() + lo, x.get(), w.get() + lo * C, static_cast<const A*>(nullptr),
                         N, C, n, OC);
    cuda::matmul_input_grad(blas, dx.get(), lo > 0, dout.get() + lo, w.get() + lo * C, N, C, n, OC);
    cuda::matmul_backward(blas, static_cast<A*>(nullptr), dw.get() + lo * C, nullptr, dout.get() + lo,
                          x.get(), w.get() + lo * C, N, C, n, OC);
  }
  std::vector<double> want(N * OC), want_dx(N * C);
  auto want_dw = dw.exact;
  host::matmul_forward(want.data(), x.exact.data(), w.exact.data(), static_cast<const double*>(nullptr),
                       N, C, OC);
  host::matmul_backward(want_dx.data(), want_dw.data(), static_cast<double*>(nullptr),
                        dout.exact.data(), x.exact.data(), w.exact.data(), N, C, OC);
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-5, 1e-2))) << "pieces' forward";
  EXPECT_TRUE(close(dx.read(), want_dx, 1e-5)) << "pieces' input gradient, in float";
  EXPECT_TRUE(close(dw.read(), want_dw, 1e-5)) << "pieces' weight gradient";
}

// The fused attention against the host kernel in double (the inputs as the
// device holds them), and each row's log-sum-exp against a naive double
// loop: head sizes 6 (element loads), 8, 64 and 96 (the 128-wide tiles),
// T = 1, T a multiple of no tile, several tiles, several batches and
// heads, grouped and multi-query. Tolerances: fp32, 1e-5 (float sums over at most T keys in another
// order); bf16, 1e-2 forward and 3e-2 backward (the probabilities and the
// scores' gradient are rounded to bf16 before their products, 2^-8).
template <class A>
void check_attention(int64_t Bn, int64_t Tn, int64_t Cn, int64_t NHn, int64_t NKVn = 0,
                     bool documents = false) {
  if (NKVn == 0) NKVn = NHn;
  SCOPED_TRACE("B " + std::to_string(Bn) + ", T " + std::to_string(Tn) + ", C " +
               std::to_string(Cn) + ", NH " + std::to_string(NHn) + ", NKV " + std::to_string(NKVn) +
               (documents ? ", documents" : ""));
  const std::vector<int32_t> pos = documents ? document_positions(Bn, Tn) : std::vector<int32_t>{};
  DevTokens dpos(documents ? pos : std::vector<int32_t>{0});
  const int32_t* dp = documents ? dpos.buf.get() : nullptr;
  const int32_t* hp = documents ? pos.data() : nullptr;
  const int64_t n = Bn * Tn * Cn, hs = Cn / NHn, rows = Bn * NHn * Tn;
  const int64_t K = NKVn * hs, W = Cn + 2 * K, g = NHn / NKVn;
  Dev<A> qkv(random_vector(Bn * Tn * W, 20));
  Dev<A> out = Dev<A>::poisoned(n);
  Dev<float> lse = Dev<float>::poisoned(rows);
  cuda::attention_forward(out.get(), lse.get(), qkv.get(), Bn, Tn, Cn, NHn, NKVn, nullptr, dp);
  std::vector<double> want(n), probs(Bn * NHn * Tn * Tn);
  host::attention_forward(want.data(), probs.data(), qkv.exact.data(), Bn, Tn, Cn, NHn, NKVn, hp);
  EXPECT_TRUE(close(out.read(), want, tol<A>(1e-5, 1e-2)));
  std::vector<double> want_lse(rows);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t b = 0; b < Bn; ++b)
    for (int64_t h = 0; h < NHn; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        double sum = 0;
        for (int64_t j = documents ? t - pos[b * Tn + t] : 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d)
            dot += qkv.exact[(b * Tn + t) * W + h * hs + d] *
                   qkv.exact[(b * Tn + j) * W + Cn + h / g * hs + d];
          sum += std::exp(scale * dot);
        }
        want_lse[(b * NHn + h) * Tn + t] = std::log(sum);
      }
  EXPECT_TRUE(close(lse.read(), want_lse, 1e-5));

  Dev<A> dout(random_vector(n, 21)), dqkv = Dev<A>::poisoned(Bn * Tn * W);
  // The scratch poisoned too: nothing may rely on it starting at zero.
  Dev<float> scratch_dev = Dev<float>::poisoned(static_cast<size_t>(attention_scratch_elements(
      AttentionStorage::kRowStatistics, Bn, NHn, Tn, hs)));
  cuda::attention_backward(dqkv.get(), scratch_dev.get(), dout.get(), qkv.get(), out.get(), lse.get(), Bn,
                           Tn, Cn, NHn, NKVn, nullptr, dp);
  std::vector<double> want_dqkv(Bn * Tn * W), scratch(Bn * NHn * Tn * Tn);
  host::attention_backward(want_dqkv.data(), scratch.data(), dout.exact.data(), qkv.exact.data(),
                           probs.data(), Bn, Tn, Cn, NHn, NKVn);
  EXPECT_TRUE(close(dqkv.read(), want_dqkv, tol<A>(1e-5, 3e-2)));
}

TYPED_TEST(GpuKernels, Attention) {
  check_attention<TypeParam>(B, T, C, NH);     // head size 8
  check_attention<TypeParam>(2, 1, C, NH);     // one token
  check_attention<TypeParam>(1, 70, 128, 2);   // head size 64, 70 tokens
  check_attention<TypeParam>(2, 37, 64, 8, 2);  // grouped-query, 4 query heads per kv head
  check_attention<TypeParam>(1, 40, 128, 2, 1);  // multi-query, head size 64
  check_attention<TypeParam>(2, 40, 192, 2);   // head size 96
  // Several 64-row tiles, the last one short: dQ is summed over the key
  // tiles' blocks in turn, and blocks hold keys of several query heads.
  check_attention<TypeParam>(1, 200, 128, 2, 1);  // head size 64, 4 tiles
  check_attention<TypeParam>(1, 130, 192, 2);     // head size 96, 3 tiles
  // Head size 6: rows that are no whole number of 16-byte pieces take the
  // element-at-a-time loads and stores.
  check_attention<TypeParam>(2, 70, 12, 2);
  // Documents: keys of other documents masked, whole tiles skipped (a
  // query tile past a key tile's documents), a one-token document.
  check_attention<TypeParam>(2, 200, 128, 2, 1, true);
  check_attention<TypeParam>(2, 70, 12, 2, 0, true);
}

// The ring's block kernels (cuda/ring_attention.hpp) against their host
// twin in double (host/attention_blocks.hpp, which the unit tests check
// against naive attention over the whole sequence): a sequence cut into
// blocks of `sizes` tokens, each block's queries taken against every
// block's keys and values in a ring's order (its own first), forward and
// backward. Blocks longer than a warp's 32 keys, the last one short,
// blocks wholly above the diagonal (skipped), grouped-query heads, and
// documents whose starts fall inside and across blocks. A: the stage's
// type, whose values the rows hold and in which the key/value blocks go
// round (float: the per-row kernels; bf16 and fp16: the tensor-core
// tiles, fed values of that type). Tolerances as
// the fused kernel's check above: fp32 1e-5 absolute and relative (float
// sums of at most a few hundred terms of size ~1 against double); 16-bit,
// 1e-2 forward and 3e-2 backward (the probabilities and the scores'
// gradients rounded to 16 bits before their products); the log-sum-exp
// 1e-5 in every type (nothing of it is rounded).
template <class A = float>
void check_ring_blocks(int64_t Bn, int64_t Cn, int64_t NHn, int64_t NKVn,
                       const std::vector<int64_t>& sizes, bool documents, int64_t document = 11) {
  SCOPED_TRACE("B " + std::to_string(Bn) + ", C " + std::to_string(Cn) + ", NH " + std::to_string(NHn) +
               ", NKV " + std::to_string(NKVn) + ", blocks " + std::to_string(sizes.size()) +
               (documents ? ", documents" : ""));
  // Values of A, as a stage of that type widens them.
  const auto random_of_a = [](int64_t count, unsigned seed) {
    std::vector<double> v = random_vector(count, seed);
    for (double& x : v) x = to_double(from_double<A>(x));
    return v;
  };
  const double fwd = tol<A>(1e-5, 1e-2), bwd = tol<A>(1e-5, 3e-2);
  const int64_t hs = Cn / NHn, K = NKVn * hs, W = Cn + 2 * K;
  const host::AttentionShape ha{Bn, Cn, NHn, NKVn};
  const cuda::RingShape ca{Bn, Cn, NHn, NKVn};
  const size_t n = sizes.size();
  std::vector<int64_t> begin(n, 0);
  for (size_t i = 1; i < n; ++i) begin[i] = begin[i - 1] + sizes[i - 1];
  int64_t most = 0;
  for (int64_t s : sizes) most = std::max(most, s);
  std::vector<Dev<float>> qkv, dout;
  std::vector<Dev<A>> kv;  // as the ring passes them: in A
  std::vector<std::vector<int64_t>> starts(n);
  std::vector<cuda::DeviceBuffer<int64_t>> dstarts;
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = Bn * sizes[i];
    qkv.emplace_back(random_of_a(rows * W, 40 + static_cast<unsigned>(i)));
    // The block's keys and values as a ring passes them: [B, n, 2K].
    std::vector<double> block(rows * 2 * K);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(qkv[i].exact.data() + r * W + Cn, 2 * K, block.data() + r * 2 * K);
    kv.emplace_back(block);
    dout.emplace_back(random_of_a(rows * Cn, 60 + static_cast<unsigned>(i)));
    // Documents of `document` + 6b tokens: each query's document's first
    // position.
    for (int64_t b = 0; b < Bn; ++b)
      for (int64_t t = 0; t < sizes[i]; ++t) {
        const int64_t pos = begin[i] + t;
        starts[i].push_back(pos - pos % (document + 6 * b));
      }
    dstarts.emplace_back(static_cast<size_t>(rows));
    cuda::copy_to_device(dstarts.back().get(), starts[i].data(), starts[i].size() * sizeof(int64_t));
  }
  std::vector<Dev<float>> dkv;
  std::vector<std::vector<double>> dkv_want(n);
  for (size_t i = 0; i < n; ++i) {
    dkv.emplace_back(std::vector<double>(Bn * sizes[i] * 2 * K, 0.0));
    dkv_want[i].assign(Bn * sizes[i] * 2 * K, 0.0);
  }
  std::vector<double> scratch(static_cast<size_t>(ring_scratch_elements(Bn, NKVn, most, most)));
  for (size_t i = 0; i < n; ++i) {
    const int64_t nq = sizes[i], rows = Bn * NHn * nq;
    const int64_t* hst = documents ? starts[i].data() : nullptr;
    const int64_t* dst = documents ? dstarts[i].get() : nullptr;
    std::vector<double> m(rows), l(rows), lse(rows), delta(rows), o(Bn * nq * Cn);
    Dev<float> dm = Dev<float>::poisoned(rows), dl = Dev<float>::poisoned(rows);
    Dev<float> dlse = Dev<float>::poisoned(rows), ddelta = Dev<float>::poisoned(rows);
    Dev<float> dev_o = Dev<float>::poisoned(o.size());
    host::ring_attention_start(ha, nq, m.data(), l.data(), o.data());
    cuda::ring_attention_start(ca, nq, dm.get(), dl.get(), dev_o.get(), nullptr);
    for (size_t s = 0; s < n; ++s) {
      const size_t j = (i + n - s) % n;
      host::ring_attention_forward(ha, qkv[i].exact.data(), begin[i], nq, kv[j].exact.data(), begin[j],
                                   sizes[j], m.data(), l.data(), o.data(), scratch.data(), hst);
      cuda::ring_attention_forward<A>(ca, qkv[i].get(), begin[i], nq, kv[j].get(), begin[j], sizes[j],
                                   dm.get(), dl.get(), dev_o.get(), nullptr, dst);
    }
    host::ring_attention_finish(ha, nq, o.data(), m.data(), l.data(), lse.data());
    cuda::ring_attention_finish(ca, nq, dev_o.get(), dm.get(), dl.get(), dlse.get(), nullptr);
    EXPECT_TRUE(close(dev_o.read(), o, fwd)) << "block " << i << ": out";
    EXPECT_TRUE(close(dlse.read(), lse, 1e-5)) << "block " << i << ": lse";
    host::ring_attention_delta(ha, nq, o.data(), dout[i].exact.data(), delta.data());
    cuda::ring_attention_delta(ca, nq, dev_o.get(), dout[i].get(), ddelta.get(), nullptr);
    EXPECT_TRUE(close(ddelta.read(), delta, fwd)) << "block " << i << ": delta";
    // dqkv's q part is added to, its k and v parts untouched: zero both.
    std::vector<double> dq(Bn * nq * W, 0.0);
    Dev<float> dev_dq(dq);
    for (size_t s = 0; s < n; ++s) {
      const size_t j = (i + n - s) % n;
      host::ring_attention_backward(ha, qkv[i].exact.data(), begin[i], nq, kv[j].exact.data(), begin[j],
                                    sizes[j], dout[i].exact.data(), lse.data(), delta.data(), dq.data(),
                                    dkv_want[j].data(), scratch.data(), hst);
      cuda::ring_attention_backward<A>(ca, qkv[i].get(), begin[i], nq, kv[j].get(), begin[j], sizes[j],
                                    dout[i].get(), dlse.get(), ddelta.get(), dev_dq.get(), dkv[j].get(),
                                    nullptr, dst);
    }
    EXPECT_TRUE(close(dev_dq.read(), dq, bwd)) << "block " << i << ": dq";
  }
  for (size_t j = 0; j < n; ++j) EXPECT_TRUE(close(dkv[j].read(), dkv_want[j], bwd)) << "block " << j << ": dkv";
}

TEST(GpuKernelsFloat, RingAttentionBlocksMatchTheHost) {
  check_ring_blocks(2, 64, 4, 4, {40, 40, 13}, false);  // head size 16; 32-key steps cross blocks
  check_ring_blocks(2, 64, 4, 2, {40, 40, 13}, true);   // grouped-query, documents
  check_ring_blocks(1, 128, 2, 1, {7, 33, 5}, true);    // multi-query, head size 64
  check_ring_blocks(1, 192, 2, 2, {20, 20}, false);     // head size 96: three channels a lane
}

// The tiles: blocks of several 64-key tiles, the last tile short, a block
// shorter than one tile, pairs wholly above the diagonal; head sizes 16
// (64-wide tiles, mostly padding), 64 and 96 (128-wide tiles).
TEST(GpuKernelsFloat, RingAttentionTilesOfSixteenBitRowsMatchTheHost) {
  check_ring_blocks<bf16>(2, 64, 4, 2, {150, 70, 13}, true);  // grouped-query, documents
  check_ring_blocks<bf16>(1, 128, 2, 1, {64, 90}, false);     // multi-query, head size 64
  check_ring_blocks<fp16>(1, 192, 2, 2, {70, 20}, true);      // head size 96
  // Documents of 63 tokens: the second starts at the first key tile's last
  // key, which the second query tile's rows see (dK/dV stop only past it).
  check_ring_blocks<bf16>(1, 64, 2, 2, {150}, true, 63);
}

// Lengths with and without a tail past the last 16-byte pack, and buffers
// one element off 16-byte alignment (the element-at-a-time path).
TYPED_TEST(GpuKernels, GeluAndResidual) {
  using A = TypeParam;
  for (const auto& [n, off] : {std::pair<int64_t, int64_t>{1000, 0}, {1003, 0}, {997, 1}}) {
    SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(off));
    Dev<A> x(random_vector(n + off, 22, 2.0)), y(random_vector(n + off, 23));
    Dev<A> out = Dev<A>::poisoned(n + off);
    const auto tail = [&](const std::vector<double>& v) {
      return std::vector<double>(v.begin() + off, v.end());
    };
    const std::vector<double> xe = tail(x.exact), ye = tail(y.exact);
    cuda::gelu_forward(out.get() + off, x.get() + off, n, nullptr);
    std::vector<double> want(n);
    host::gelu_forward(want.data(), xe.data(), n);
    EXPECT_TRUE(close(tail(out.read()), want, tol<A>(1e-6, 1e-2)));
    Dev<A> din = Dev<A>::poisoned(n + off);
    cuda::gelu_backward(din.get() + off, x.get() + off, y.get() + off, n, nullptr);
    host::gelu_backward(want.data(), xe.data(), ye.data(), n);
    EXPECT_TRUE(close(tail(din.read()), want, tol<A>(1e-6, 1e-2)));
    Dev<A> sum = Dev<A>::poisoned(n + off);
    cuda::residual_forward(sum.get() + off, x.get() + off, y.get() + off, n, nullptr);
    host::residual_forward(want.data(), xe.data(), ye.data(), n);
    EXPECT_TRUE(close(tail(sum.read()), want, tol<A>(1e-7, 1e-2)));
  }
}

// ZeRO's mixed-type adds ([train] grad_dtype = bf16): float gradients into
// 16-bit sums and 16-bit parts into float, each added in float and rounded
// once to the destination's type: the same bits as that done on the host.
TYPED_TEST(GpuKernels, AddIntoAcrossTypes) {
  using A = TypeParam;
  if constexpr (!std::is_same_v<A, float>) {
    const int64_t n = 1003;
    Dev<A> sums(random_vector(n, 24)), parts(random_vector(n, 25));
    Dev<float> grads(random_vector(n, 26)), totals(random_vector(n, 27, 4.0));
    const std::vector<double> s0 = sums.exact, g = grads.exact, t0 = totals.exact, p = parts.exact;
    cuda::add_into(sums.get(), grads.get(), n, nullptr);
    cuda::add_into(totals.get(), parts.get(), n, nullptr);
    const std::vector<double> s1 = sums.read(), t1 = totals.read();
    for (int64_t i = 0; i < n; ++i) {
      const float sum = static_cast<float>(s0[i]) + static_cast<float>(g[i]);
      ASSERT_EQ(s1[i], to_double(from_double<A>(sum))) << i;
      ASSERT_EQ(t1[i], static_cast<double>(static_cast<float>(t0[i]) + static_cast<float>(p[i]))) << i;
    }
  }
}

TYPED_TEST(GpuKernels, CrossEntropy) {
  using A = TypeParam;
  const int64_t N = B * T;
  const auto tgt = random_tokens(N, V, 24);
  DevTokens dt(tgt);
  // Padded columns hold garbage: they must not enter the softmax.
  auto z = random_vector(N * Vp, 25, 3.0);
  Dev<A> logits(z);
  Dev<float> losses = Dev<float>::poisoned(N);
  cuda::crossentropy_forward(losses.get(), logits.get(), dt.buf.get(), N, V, Vp, nullptr);
  std::vector<double> want(N);
  host::crossentropy_forward(want.data(), logits.exact.data(), tgt.data(), N, V, Vp);
  EXPECT_TRUE(close(losses.read(), want, 1e-5));

  const double scale = 1.0 / 64;
  Dev<float> losses2 = Dev<float>::poisoned(N);
  cuda::crossentropy_forward_backward(losses2.get(), logits.get(), dt.buf.get(), N, V, Vp,
                                      static_cast<float>(scale), nullptr);
  auto grad = logits.exact;
  host::crossentropy_forward_backward(want.data(), grad.data(), tgt.data(), N, V, Vp, scale);
  EXPECT_TRUE(close(losses2.read(), want, 1e-5));
  // Gradients are at most `scale` in size: compare relative to it.
  auto got = logits.read();
  for (auto* v : {&got, &grad})
    for (auto& g : *v) g /= scale;
  EXPECT_TRUE(close(got, grad, tol<A>(1e-5, 1e-2)));
}

// The vocabulary-parallel passes on one rank's slice (the group's
// all-reduces are the tests' business elsewhere): each pass against its
// host twin, the statistics fed to both from the host's.
TYPED_TEST(GpuKernels, VocabParallelCrossEntropy) {
  using A = TypeParam;
  const int64_t N = B * T, Vl = Vp / 2, Vreal = Vl - 3, v0 = Vl;
  const auto tgt = random_tokens(N, 4 * Vp, 31);  // [0, Vp]: some in the slice, some not
  DevTokens dt(tgt);
  Dev<A> logits(random_vector(N * Vl, 32, 3.0));
  Dev<float> rowmax = Dev<float>::poisoned(N), stats = Dev<float>::poisoned(2 * N);
  std::vector<double> want_max(N), want_stats(2 * N), want_losses(N);
  cuda::crossentropy_vp_max(rowmax.get(), logits.get(), N, Vreal, Vl, nullptr);
  host::crossentropy_vp_max(want_max.data(), logits.exact.data(), N, Vreal, Vl);
  EXPECT_TRUE(close(rowmax.read(), want_max, 1e-6));
  cuda::crossentropy_vp_sums(stats.get(), logits.get(), dt.buf.get(), rowmax.get(), N, Vreal, Vl,
                             v0, nullptr);
  host::crossentropy_vp_sums(want_stats.data(), logits.exact.data(), tgt.data(), want_max.data(), N,
                             Vreal, Vl, v0);
  EXPECT_TRUE(close(stats.read(), want_stats, tol<A>(1e-5, 1e-2)));
  const double scale = 1.0 / 64;
  Dev<float> losses = Dev<float>::poisoned(N);
  Dev<float> host_stats(want_stats);
  cuda::crossentropy_vp_finish(losses.get(), logits.get(), dt.buf.get(), rowmax.get(),
                               host_stats.get(), N, Vreal, Vl, v0, static_cast<float>(scale), true,
                               nullptr);
  auto grad = logits.exact;
  host::crossentropy_vp_finish(want_losses.data(), grad.data(), tgt.data(), want_max.data(),
                               want_stats.data(), N, Vreal, Vl, v0, scale, true);
  EXPECT_TRUE(close(losses.read(), want_losses, 1e-5));
  auto got = logits.read();
  for (auto* v : {&got, &grad})
    for (auto& g : *v) g /= scale;
  EXPECT_TRUE(close(got, grad, tol<A>(1e-5, 1e-2)));
}

TEST(GpuKernelsFloat, AdamWWithBf16Copy) {
  const int64_t n = 3000;
  Dev<float> p(random_vector(n, 26)), g(random_vector(n, 27)), m(random_vector(n, 28, 0.1));
  auto v0 = random_vector(n, 29, 0.1);
  for (auto& x : v0) x = x * x;
  Dev<float> v(v0);
  Dev<bf16> copy = Dev<bf16>::poisoned(n);
  const AdamWParams ap{1e-3, 0.9, 0.95, 1e-8, 0.1, 7, 0.5};
  cuda::adamw_update(p.get(), g.get(), m.get(), v.get(), n, ap, copy.get(), nullptr);
  // The host's kernel in float, as the device computes.
  auto wp = floats(p.exact), wm = floats(m.exact), wv = floats(v.exact), wg = floats(g.exact);
  host::adamw_update(wp.data(), wg.data(), wm.data(), wv.data(), n, ap);
  // One arithmetic for both (common/adamw_math.hpp): the same bits, so the
  // state's placement ([train] offload) never changes a number.
  EXPECT_EQ(p.read(), doubles(wp));
  EXPECT_EQ(m.read(), doubles(wm));
  EXPECT_EQ(v.read(), doubles(wv));
  EXPECT_TRUE(close(copy.read(), doubles(wp), 1e-2));
}

// The one-launch form over a model's tensors: two ranges with different
// decay, longer than a chunk, and a gap between them that must stay as it was.
TEST(GpuKernelsFloat, AdamWChunksMatchPerTensorUpdates) {
  const int64_t n1 = kAdamWChunkElements + 77, gap = 50, n2 = 300, n = n1 + gap + n2;
  Dev<float> p(random_vector(n, 31)), g(random_vector(n, 32)), m(random_vector(n, 33, 0.1));
  auto v0 = random_vector(n, 34, 0.1);
  for (auto& x : v0) x = x * x;
  Dev<float> v(v0);
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, n1, true);
  append_adamw_chunks(chunks, n1 + gap, n2, false);
  ASSERT_EQ(chunks.size(), 3u);
  cuda::DeviceBuffer<AdamWChunk> dchunks(chunks.size());
  cuda::copy_to_device(dchunks.get(), chunks.data(), sizeof(AdamWChunk) * chunks.size());
  const AdamWParams ap{1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.7};
  cuda::adamw_update_chunks(p.get(), g.get(), m.get(), v.get(), dchunks.get(),
                            static_cast<int64_t>(chunks.size()), ap, static_cast<float*>(nullptr),
                            nullptr);
  auto wp = floats(p.exact), wm = floats(m.exact), wv = floats(v.exact), wg = floats(g.exact);
  AdamWParams a2 = ap;
  a2.weight_decay = 0.0;  // the second range is not decayed
  host::adamw_update(wp.data(), wg.data(), wm.data(), wv.data(), n1, ap);
  host::adamw_update(wp.data() + n1 + gap, wg.data() + n1 + gap, wm.data() + n1 + gap,
                     wv.data() + n1 + gap, n2, a2);
  EXPECT_EQ(p.read(), doubles(wp));  // bit for bit; the gap is unchanged in wp too
  EXPECT_EQ(m.read(), doubles(wm));
  EXPECT_EQ(v.read(), doubles(wv));
}

// [train] grad_dtype = bf16 at zero 1: chunks flagged narrow read their
// gradients from the 16-bit array (at their own offsets), the others from
// the float one; each equals, bit for bit, the float update of the same
// values widened.
TEST(GpuKernelsFloat, AdamWReadsNarrowChunksFromSixteenBitGradients) {
  const int64_t n1 = 700, n2 = 300, n = n1 + n2;
  Dev<float> p(random_vector(n, 41)), m(random_vector(n, 43, 0.1)), g(random_vector(n2, 42));
  Dev<bf16> g16(random_vector(n1 + 5, 44));  // the narrow chunk reads from offset 5
  auto v0 = random_vector(n, 45, 0.1);
  for (auto& x : v0) x = x * x;
  Dev<float> v(v0);
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, AdamWPlaces{0, 0, 5, 0}, n1, true, true);
  append_adamw_chunks(chunks, AdamWPlaces{n1, n1, 0, n1}, n2, true);
  cuda::DeviceBuffer<AdamWChunk> dchunks(chunks.size());
  cuda::copy_to_device(dchunks.get(), chunks.data(), sizeof(AdamWChunk) * chunks.size());
  const AdamWParams ap{1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.7};
  cuda::adamw_update_chunks(p.get(), static_cast<const float*>(g.get()), m.get(), v.get(),
                            dchunks.get(), static_cast<int64_t>(chunks.size()), ap,
                            static_cast<bf16*>(nullptr), nullptr, static_cast<const bf16*>(g16.get()));
  std::vector<float> wg = floats(std::vector<double>(g16.exact.begin() + 5, g16.exact.end()));
  for (double x : g.exact) wg.push_back(static_cast<float>(x));
  auto wp = floats(p.exact), wm = floats(m.exact), wv = floats(v.exact);
  host::adamw_update(wp.data(), wg.data(), wm.data(), wv.data(), n, ap);
  EXPECT_EQ(p.read(), doubles(wp));
  EXPECT_EQ(m.read(), doubles(wm));
  EXPECT_EQ(v.read(), doubles(wv));
}

// How many of `got` differ in their bits from `want`, a NaN matching any NaN.
int64_t differing_bits(const std::vector<float>& got, const std::vector<float>& want) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) bad += std::isnan(got[i]) ? 0 : 1;
    else bad += std::memcmp(&got[i], &want[i], 4) != 0 ? 1 : 0;
  }
  return bad;
}

// [train] grad_compression's three kernels against their host twins, bit
// for bit (the wire, the residuals, the expanded sums), in bf16 and int8:
// 3 parts of a bucket of 1000 (chunks of 334, the last short: two blocks
// of 256 each, the second partial), values of mixed sizes, and a NaN in
// one int8 block (its scale reads back NaN, so the whole block does).
TEST(GpuKernelsFloat, GradientCompressionMatchesTheHost) {
  const int parts = 3;
  const int64_t n = 1000, c = chunk_elements(n, parts);
  for (bool int8 : {false, true}) {
    const int64_t bytes = compressed_chunk_bytes(int8, c);
    std::vector<float> g(n), r(n), s(c);
    auto gd = random_vector(n, 61), rd = random_vector(n, 62, 0.01), sd = random_vector(c, 63, 0.01);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = static_cast<float>(gd[i] * (i % 5 == 0 ? 100.0 : 1.0));
      r[i] = static_cast<float>(rd[i]);
    }
    for (int64_t i = 0; i < c; ++i) s[i] = static_cast<float>(sd[i]);
    if (int8) g[700] = std::nanf("");
    std::vector<uint8_t> wire(parts * bytes), out(bytes);
    std::vector<float> hr = r, hs = s, expanded(n);
    host::compress_with_feedback(int8, g.data(), hr.data(), n, parts, wire.data());
    host::sum_compressed(int8, wire.data(), parts, c, c - 1, hs.data(), out.data());
    host::expand_compressed(int8, wire.data(), parts, n, expanded.data());

    cuda::DeviceBuffer<float> dg(n), dr(n), ds(c), dexp(n);
    cuda::DeviceBuffer<uint8_t> dwire(wire.size()), dout(bytes);
    cuda::copy_to_device(dg.get(), g.data(), 4 * n);
    cuda::copy_to_device(dr.get(), r.data(), 4 * n);
    cuda::copy_to_device(ds.get(), s.data(), 4 * c);
    cuda::compress_with_feedback(int8, dg.get(), dr.get(), n, parts, dwire.get(), nullptr);
    cuda::sum_compressed(int8, dwire.get(), parts, c, c - 1, ds.get(), dout.get(), nullptr);
    cuda::expand_compressed(int8, dwire.get(), parts, n, dexp.get(), nullptr);
    std::vector<uint8_t> got_wire(wire.size()), got_out(bytes);
    std::vector<float> got_r(n), got_s(c), got_exp(n);
    cuda::copy_to_host(got_wire.data(), dwire.get(), got_wire.size());
    cuda::copy_to_host(got_out.data(), dout.get(), got_out.size());
    cuda::copy_to_host(got_r.data(), dr.get(), 4 * n);
    cuda::copy_to_host(got_s.data(), ds.get(), 4 * c);
    cuda::copy_to_host(got_exp.data(), dexp.get(), 4 * n);
    EXPECT_EQ(got_wire, wire) << (int8 ? "int8" : "bf16");
    EXPECT_EQ(got_out, out) << (int8 ? "int8" : "bf16");
    // Bit for bit, but a NaN's bits are the hardware's own (x86 makes
    // 0xffc00000, a GPU 0x7fffffff): NaN where the host has NaN.
    EXPECT_EQ(0, differing_bits(got_r, hr)) << (int8 ? "int8" : "bf16");
    EXPECT_EQ(0, differing_bits(got_s, hs)) << (int8 ? "int8" : "bf16");
    EXPECT_EQ(0, differing_bits(got_exp, expanded)) << (int8 ? "int8" : "bf16");
    // The host's own sense: what goes out and what is kept make the input.
    if (!int8) {
      EXPECT_EQ(expanded[3] + hr[3], g[3] + r[3]);
    } else {
      EXPECT_TRUE(std::isnan(expanded[700]) && std::isnan(expanded[690]));
      EXPECT_FALSE(std::isnan(expanded[3]));
      EXPECT_NEAR(expanded[3] + hr[3], g[3] + r[3], 1e-4);
    }
  }
}

TEST(GpuKernelsFloat, Reductions) {
  const int64_t n = 100003;  // not a multiple of any block size
  Dev<float> x(random_vector(n, 30));
  Dev<double> out(std::vector<double>{5.0});
  cuda::DeviceBuffer<double> scratch(cuda::kReduceBlocks);
  double want_sq = 0, want_sum = 0;
  for (double e : x.exact) {
    want_sq += e * e;
    want_sum += e;
  }
  cuda::reduce_sum(out.get(), x.get(), n, true, false, scratch.get(), nullptr);
  EXPECT_NEAR(out.read()[0], want_sq, 1e-9 * want_sq);
  // Accumulating the plain sum onto it; double accumulation: 1e-9 relative to
  // the sum of magnitudes.
  cuda::reduce_sum(out.get(), x.get(), n, false, true, scratch.get(), nullptr);
  EXPECT_NEAR(out.read()[0], want_sq + want_sum, 1e-9 * want_sq);
}

}  // namespace
}  // namespace mpiformer::test

