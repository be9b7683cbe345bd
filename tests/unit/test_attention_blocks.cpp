// Blockwise causal attention (host/attention_blocks.hpp: online softmax
// across key/value blocks, the arithmetic of ring attention) against naive
// attention over the whole sequence in double, written here with explicit
// loops: the output, and the gradients of q, k and v for a random output
// gradient. Several block sizes with the last block short, key/value
// blocks visited in a rotated order (as a ring delivers them), and the
// head-tail chunks of context parallelism at cp 2 and 3, each rank's two
// query chunks taking every rank's key/value chunks in ring order.
// Tolerance: float against double over at most 48 keys per row, with a
// 2-ulp exp: 2e-5 of the largest value of each result (seen: ~1e-6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "host/attention.hpp"
#include "host/attention_blocks.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

struct Naive {
  std::vector<double> out, dq, dk, dv;
};

// Single head, q k v [T, hs], causal; dout [T, hs]. `first` (empty: one
// document): each position's document's first position; a query sees
// keys from there to itself.
Naive naive(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
            const std::vector<double>& dout, int64_t T, int64_t hs,
            const std::vector<int64_t>& first = {}) {
  auto from = [&](int64_t t) { return first.empty() ? int64_t{0} : first[t]; };
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Naive r;
  r.out.assign(T * hs, 0.0);
  r.dq.assign(T * hs, 0.0);
  r.dk.assign(T * hs, 0.0);
  r.dv.assign(T * hs, 0.0);
  std::vector<std::vector<double>> p(T, std::vector<double>(T, 0.0));
  for (int64_t t = 0; t < T; ++t) {
    double mx = -1e300;
    for (int64_t j = from(t); j <= t; ++j) {
      double s = 0;
      for (int64_t c = 0; c < hs; ++c) s += q[t * hs + c] * k[j * hs + c];
      p[t][j] = s * scale;
      mx = std::max(mx, p[t][j]);
    }
    double sum = 0;
    for (int64_t j = from(t); j <= t; ++j) sum += (p[t][j] = std::exp(p[t][j] - mx));
    for (int64_t j = from(t); j <= t; ++j) {
      p[t][j] /= sum;
      for (int64_t c = 0; c < hs; ++c) r.out[t * hs + c] += p[t][j] * v[j * hs + c];
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> dp(t + 1, 0.0);
    double rowdot = 0;
    for (int64_t j = from(t); j <= t; ++j) {
      for (int64_t c = 0; c < hs; ++c) {
        dp[j] += dout[t * hs + c] * v[j * hs + c];
        r.dv[j * hs + c] += p[t][j] * dout[t * hs + c];
      }
      rowdot += p[t][j] * dp[j];
    }
    for (int64_t j = from(t); j <= t; ++j) {
      const double ds = p[t][j] * (dp[j] - rowdot) * scale;
      for (int64_t c = 0; c < hs; ++c) {
        r.dq[t * hs + c] += ds * k[j * hs + c];
        r.dk[j * hs + c] += ds * q[t * hs + c];
      }
    }
  }
  return r;
}

// A rank's query blocks: (first position, rows) each; the key/value blocks
// it takes, in the order they come.
struct Span {
  int64_t begin, rows;
};

// Blockwise forward and backward over `queries`, each against `keys` in
// `order(qi)`, in float; the results laid out over the whole sequence.
struct Blockwise {
  std::vector<float> out, dq, dk, dv;
};
template <class Order>
Blockwise blockwise(const std::vector<double>& qd, const std::vector<double>& kd,
                    const std::vector<double>& vd, const std::vector<double>& doutd, int64_t T,
                    int64_t hs, const std::vector<Span>& queries, const std::vector<Span>& keys,
                    Order order, const std::vector<int64_t>& first = {}) {
  auto starts = [&](const Span& a) { return first.empty() ? nullptr : first.data() + a.begin; };
  const std::vector<float> q(qd.begin(), qd.end()), k(kd.begin(), kd.end()), v(vd.begin(), vd.end()),
      dout(doutd.begin(), doutd.end());
  Blockwise r;
  r.out.assign(T * hs, 0.f);
  r.dq.assign(T * hs, 0.f);
  r.dk.assign(T * hs, 0.f);
  r.dv.assign(T * hs, 0.f);
  std::vector<float> m(T), l(T), lse(T), delta(T), s(T * T), ds(T * T);
  for (size_t qi = 0; qi < queries.size(); ++qi) {
    const Span a = queries[qi];
    float* o = r.out.data() + a.begin * hs;
    host::block_attention_start(m.data() + a.begin, l.data() + a.begin, o, hs, a.rows, hs);
    for (const size_t ki : order(qi)) {
      const Span b = keys[ki];
      host::block_attention_forward(q.data() + a.begin * hs, hs, a.begin, a.rows, k.data() + b.begin * hs,
                                    v.data() + b.begin * hs, hs, b.begin, b.rows, hs,
                                    m.data() + a.begin, l.data() + a.begin, o, hs, s.data(), starts(a));
    }
    host::block_attention_finish(o, hs, m.data() + a.begin, l.data() + a.begin, a.rows, hs,
                                 lse.data() + a.begin);
    host::block_attention_delta(dout.data() + a.begin * hs, hs, o, hs, a.rows, hs, delta.data() + a.begin);
    for (const size_t ki : order(qi)) {
      const Span b = keys[ki];
      host::block_attention_backward(
          q.data() + a.begin * hs, hs, a.begin, a.rows, k.data() + b.begin * hs, v.data() + b.begin * hs,
          hs, b.begin, b.rows, hs, dout.data() + a.begin * hs, hs, lse.data() + a.begin,
          delta.data() + a.begin, r.dq.data() + a.begin * hs, hs, r.dk.data() + b.begin * hs,
          r.dv.data() + b.begin * hs, hs, s.data(), ds.data(), starts(a));
    }
  }
  return r;
}

void check(int64_t T, int64_t hs, const std::vector<Span>& queries, const std::vector<Span>& keys,
           const std::function<std::vector<size_t>(size_t)>& order, const char* what,
           const std::vector<int64_t>& first = {}) {
  const auto q = random_vector(T * hs, 1), k = random_vector(T * hs, 2), v = random_vector(T * hs, 3),
             dout = random_vector(T * hs, 4);
  const Naive want = naive(q, k, v, dout, T, hs, first);
  const Blockwise got = blockwise(q, k, v, dout, T, hs, queries, keys, order, first);
  EXPECT_TRUE(close_to_largest(got.out, want.out, 2e-5)) << what;
  EXPECT_TRUE(close_to_largest(got.dq, want.dq, 2e-5)) << what;
  EXPECT_TRUE(close_to_largest(got.dk, want.dk, 2e-5)) << what;
  EXPECT_TRUE(close_to_largest(got.dv, want.dv, 2e-5)) << what;
}

std::vector<Span> cut(int64_t T, int64_t block) {
  std::vector<Span> s;
  for (int64_t b = 0; b < T; b += block) s.push_back({b, std::min(block, T - b)});
  return s;
}

// Key/value blocks from the query block's own onwards, wrapping (a ring's
// order: every block, the masked ones skipped), of `n`.
std::function<std::vector<size_t>(size_t)> ring_order(size_t n) {
  return [n](size_t qi) {
    std::vector<size_t> o;
    for (size_t s = 0; s < n; ++s) o.push_back((qi + s) % n);
    return o;
  };
}

TEST(AttentionBlocks, MatchNaiveAttentionAtEveryBlockCount) {
  const int64_t T = 37, hs = 8;
  for (const int64_t block : {37, 16, 8, 5}) {
    const std::vector<Span> spans = cut(T, block);  // the last one short, but at 37
    const size_t n = spans.size();
    check(T, hs, spans, spans, ring_order(n), ("block " + std::to_string(block)).c_str());
  }
}

// Under a document mask (documents starting at 0, 3, 4, 17 and 30: one
// of a single token, one longer than a block), each query sees its own
// document's keys only; blocks holding none of a chunk's documents are
// skipped. At every block count, the ring's order.
TEST(AttentionBlocks, DocumentsMatchNaiveAttentionAtEveryBlockCount) {
  const int64_t T = 37, hs = 8;
  std::vector<int64_t> first(T);
  for (int64_t t = 0; t < T; ++t) first[t] = t >= 30 ? 30 : t >= 17 ? 17 : t >= 4 ? 4 : t >= 3 ? 3 : 0;
  for (const int64_t block : {37, 16, 8, 5}) {
    const std::vector<Span> spans = cut(T, block);
    const size_t n = spans.size();
    check(T, hs, spans, spans, ring_order(n), ("documents, block " + std::to_string(block)).c_str(),
          first);
  }
  // A block of another document only is skipped; one holding part of the
  // chunk's document is not.
  EXPECT_FALSE(host::block_visible(first.data() + 30, 30, 7, 5, 5));
  EXPECT_TRUE(host::block_visible(first.data() + 30, 30, 7, 25, 10));
}

TEST(AttentionBlocks, HeadTailChunksAroundARing) {
  const int64_t hs = 4;
  for (const int64_t cp : {2, 3}) {
    const int64_t T = 2 * cp * 6, chunk = T / (2 * cp);
    // Rank r's two chunks; its queries take rank (r - s) mod cp's two at
    // ring step s.
    std::vector<Span> queries, keys;
    for (int64_t r = 0; r < cp; ++r) {
      const ContextChunkPair c = context_chunks(r, cp);
      for (const int64_t i : {c.first, c.second}) keys.push_back({i * chunk, chunk});
    }
    queries = keys;  // query block 2r + j is rank r's chunk j
    check(T, hs, queries, keys,
          [cp](size_t qi) {
            const int64_t r = static_cast<int64_t>(qi) / 2;
            std::vector<size_t> o;
            for (int64_t s = 0; s < cp; ++s) {
              const int64_t from = (r - s + cp) % cp;
              o.push_back(static_cast<size_t>(2 * from));
              o.push_back(static_cast<size_t>(2 * from + 1));
            }
            return o;
          },
          ("cp " + std::to_string(cp)).c_str());
  }
}

// The causal work (query-key pairs seen) of each rank: equal with
// head-tail chunks; with a plain split the last rank does 2 cp - 1 times
// the first's.
TEST(AttentionBlocks, HeadTailChunksBalanceTheCausalWork) {
  for (const int64_t cp : {2, 4, 8}) {
    const int64_t chunk = 16, T = 2 * cp * chunk;
    auto pairs = [&](int64_t first, int64_t rows) {
      int64_t n = 0;
      for (int64_t t = first; t < first + rows; ++t) n += host::visible_keys(t, 0, T);
      return n;
    };
    std::vector<int64_t> balanced, plain;
    for (int64_t r = 0; r < cp; ++r) {
      const ContextChunkPair c = context_chunks(r, cp);
      balanced.push_back(pairs(c.first * chunk, chunk) + pairs(c.second * chunk, chunk));
      const ContextChunkPair p = context_chunks(r, cp, ContextChunks::kContiguous);
      ASSERT_EQ(p.second, p.first + 1);
      plain.push_back(pairs(p.first * chunk, 2 * chunk));
    }
    EXPECT_EQ(*std::min_element(balanced.begin(), balanced.end()),
              *std::max_element(balanced.begin(), balanced.end()))
        << "cp " << cp;
    EXPECT_GT(plain.back(), (2 * cp - 2) * plain.front()) << "cp " << cp;
  }
}

// Every head at once in the model's layouts (grouped-query: 4 query heads
// on 2 kv heads), in query tiles, each rank's chunk of rows as a ring rank holds it, its
// query rows against every key/value block in ring order, against the
// trainer's own host attention over the whole sequence (float both: 2e-5
// of the largest value, another order of the same sums).
TEST(AttentionBlocks, EveryHeadInTheModelsLayoutsMatchesHostAttention) {
  const host::AttentionShape a{2, 16, 4, 2};
  const int64_t T = 37, K = a.K(), ld = a.C + 2 * K, block = 8;
  const std::vector<Span> spans = cut(T, block);
  const auto qkv_d = random_vector(a.B * T * ld, 5), dout_d = random_vector(a.B * T * a.C, 6);
  const std::vector<float> qkv(qkv_d.begin(), qkv_d.end()), dout(dout_d.begin(), dout_d.end());
  // The reference: host/attention.hpp over the whole sequence.
  std::vector<float> out(a.B * T * a.C), att(a.B * a.NH * T * T), dqkv(a.B * T * ld),
      datt(att.size());
  host::attention_forward(out.data(), att.data(), qkv.data(), a.B, T, a.C, a.NH, a.NKV);
  host::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), a.B, T, a.C,
                           a.NH, a.NKV);
  // Each block's rows as a rank holds them: qkv [B, n, ld], kv [B, n, 2K],
  // dout [B, n, C].
  auto rows = [&](const std::vector<float>& x, int64_t width, int64_t from, int64_t w, const Span& s) {
    std::vector<float> r(a.B * s.rows * w);
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t t = 0; t < s.rows; ++t)
        std::copy_n(x.data() + (b * T + s.begin + t) * width + from, w, r.data() + (b * s.rows + t) * w);
    return r;
  };
  const size_t n = spans.size();
  // Query tiles of 3 rows: 3, 3, 2 of a block of 8, 3 and 2 of the last
  // (short) block of 5.
  const int64_t tile = 3;
  std::vector<float> scratch(ring_scratch_elements(a.B, a.NKV, block, block, tile));
  std::vector<std::vector<float>> q(n), kv(n), dq(n), dkv(n), o(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    q[i] = rows(qkv, ld, 0, ld, spans[i]);
    kv[i] = rows(qkv, ld, a.C, 2 * K, spans[i]);
    d[i] = rows(dout, a.C, 0, a.C, spans[i]);
    dq[i].assign(q[i].size(), 0.f);
    dkv[i].assign(kv[i].size(), 0.f);
  }
  for (size_t i = 0; i < n; ++i) {
    const Span qs = spans[i];
    std::vector<float> m(a.B * a.NH * qs.rows), l(m.size()), lse(m.size()), delta(m.size());
    o[i].assign(a.B * qs.rows * a.C, 0.f);
    host::ring_attention_start(a, qs.rows, m.data(), l.data(), o[i].data());
    for (size_t s = 0; s < n; ++s) {
      const size_t j = (i + s) % n;
      host::ring_attention_forward(a, q[i].data(), qs.begin, qs.rows, kv[j].data(), spans[j].begin,
                                   spans[j].rows, m.data(), l.data(), o[i].data(), scratch.data(),
                                   nullptr, tile);
    }
    host::ring_attention_finish(a, qs.rows, o[i].data(), m.data(), l.data(), lse.data());
    host::ring_attention_delta(a, qs.rows, o[i].data(), d[i].data(), delta.data());
    for (size_t s = 0; s < n; ++s) {
      const size_t j = (i + s) % n;
      host::ring_attention_backward(a, q[i].data(), qs.begin, qs.rows, kv[j].data(), spans[j].begin,
                                    spans[j].rows, d[i].data(), lse.data(), delta.data(), dq[i].data(),
                                    dkv[j].data(), scratch.data(), nullptr, tile);
    }
  }
  // Laid back over the sequence: out, and dqkv from the q parts and the
  // kv blocks' sums.
  std::vector<double> want_out(out.begin(), out.end()), want_d(dqkv.begin(), dqkv.end());
  std::vector<float> got_out(out.size()), got_d(dqkv.size());
  for (size_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t t = 0; t < spans[i].rows; ++t) {
        const int64_t at = b * T + spans[i].begin + t, here = b * spans[i].rows + t;
        std::copy_n(o[i].data() + here * a.C, a.C, got_out.data() + at * a.C);
        std::copy_n(dq[i].data() + here * ld, a.C, got_d.data() + at * ld);
        std::copy_n(dkv[i].data() + here * 2 * K, 2 * K, got_d.data() + at * ld + a.C);
      }
  EXPECT_TRUE(close_to_largest(got_out, want_out, 2e-5)) << "out";
  EXPECT_TRUE(close_to_largest(got_d, want_d, 2e-5)) << "dqkv";
}

TEST(AttentionBlocks, AFullyMaskedPairIsSkipped) {
  EXPECT_FALSE(host::block_visible(0, 8, 8, 8));
  EXPECT_TRUE(host::block_visible(8, 8, 15, 8));
  EXPECT_FALSE(host::block_visible(8, 0, 0, 8));
  EXPECT_EQ(host::visible_keys(10, 8, 8), 3);
  EXPECT_EQ(host::visible_keys(3, 8, 8), 0);
  EXPECT_EQ(host::visible_keys(30, 8, 8), 8);
}

}  // namespace
}  // namespace mpiformer::test
