// Every host kernel in bf16 and fp16 storage (precision "bf16" / "fp16")
// against naive double loops written here. The inputs are rounded to the
// format first and the reference runs on those very values, so what is
// measured is the kernel's own error: float arithmetic, plus one rounding of
// each stored output.
//
// Tolerances: a value rounded once to nearest is within u |x| of itself,
// u = 2^-8 for bf16 (8 significant bits) and 2^-11 for fp16 (11); float
// accumulation adds about K 2^-24 of the terms' magnitudes, far below u.
// So a 16-bit output must satisfy |got - want| <= 1.5 u |want| + abs, with
// abs = 1e-4 x the output's largest magnitude for sums that cancel; a float
// output (statistics, parameter gradients) 1e-4 relative (its inputs exact,
// its error float's). Each tolerance fails when the kernel rounds twice, or
// reads a wrong element, or drops the float accumulation for the format's.
#include <cmath>
#include <vector>

#include "host/adamw.hpp"
#include "host/attention.hpp"
#include "host/crossentropy.hpp"
#include "host/embedding.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"
#include "host/residual.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

template <class A>
constexpr double unit_roundoff() {
  return std::is_same_v<A, host::Bf16> ? 0x1p-8 : 0x1p-11;
}

// Rounds v to A in place (the reference then sees what the kernel sees) and
// returns the A copy.
template <class A>
std::vector<A> narrow(std::vector<double>& v) {
  std::vector<A> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = A(static_cast<float>(v[i]));
    v[i] = static_cast<double>(static_cast<float>(out[i]));
  }
  return out;
}

template <class A>
std::vector<double> widen(const std::vector<A>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
  return out;
}

double largest(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// A 16-bit output against its reference.
template <class A>
::testing::AssertionResult close16(const std::vector<A>& got, const std::vector<double>& want,
                                   double units = 1.5) {
  return all_close(widen(got), want, 1e-4 * largest(want), units * unit_roundoff<A>());
}

template <class A>
class NarrowKernels : public ::testing::Test {};
using Formats = ::testing::Types<host::Bf16, host::Fp16>;
TYPED_TEST_SUITE(NarrowKernels, Formats);

TYPED_TEST(NarrowKernels, MatmulForwardAndBackward) {
  using A = TypeParam;
  const int64_t N = 24, C = 40, OC = 36;
  auto x = random_vector(N * C, 1), w = random_vector(OC * C, 2, 0.3), b = random_vector(OC, 3);
  auto dout = random_vector(N * OC, 4);
  const auto xa = narrow<A>(x), wa = narrow<A>(w), ba = narrow<A>(b), da = narrow<A>(dout);
  std::vector<double> y(N * OC), dx(N * C, 0), dw(OC * C, 0), db(OC, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b[o];
      for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      y[n * OC + o] = s;
      db[o] += dout[n * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        dx[n * C + c] += dout[n * OC + o] * w[o * C + c];
        dw[o * C + c] += dout[n * OC + o] * x[n * C + c];
      }
    }
  std::vector<A> out(N * OC), dinp(N * C);
  host::matmul_forward(out.data(), xa.data(), wa.data(), ba.data(), N, C, OC);
  EXPECT_TRUE(close16(out, y));
  // Parameter gradients accumulate in float onto what is there.
  std::vector<float> gw(OC * C, 0.5f), gb(OC, -0.25f);
  host::matmul_backward(dinp.data(), gw.data(), gb.data(), da.data(), xa.data(), wa.data(), N, C,
                        OC);
  EXPECT_TRUE(close16(dinp, dx));
  for (auto& v : dw) v += 0.5;
  for (auto& v : db) v -= 0.25;
  EXPECT_TRUE(all_close(gw, dw, 1e-5, 1e-4)) << "dweight";
  EXPECT_TRUE(all_close(gb, db, 1e-5, 1e-4)) << "dbias";
}

// The LM head's vocabulary pieces: the product writes and reads a column
// range [at, at + OC) of logits rows `ld` apart (host/matmul.hpp packs a
// bf16 range dense for oneDNN). The columns outside stay as they were;
// the input gradient adds up over two ranges in float.
TYPED_TEST(NarrowKernels, MatmulOverAColumnRange) {
  using A = TypeParam;
  const int64_t N = 24, C = 40, OC = 36, ld = 100, at = 48;
  auto x = random_vector(N * C, 5), w = random_vector(2 * OC * C, 6, 0.3);
  auto logits = random_vector(N * ld, 7);
  const auto xa = narrow<A>(x), wa = narrow<A>(w);
  auto la = narrow<A>(logits);
  std::vector<double> y = logits, dx(N * C, 0), dw(OC * C, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      y[n * ld + at + o] = s;
    }
  host::matmul_forward(la.data() + at, xa.data(), wa.data(), static_cast<const A*>(nullptr), N, C,
                       OC, ld);
  EXPECT_TRUE(close16(la, y));
  // Backward from the logits (now y) as the output gradient: its two
  // ranges [0, OC) and [at, at + OC) against weights w's two halves.
  const std::vector<double> d = widen(la);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) {
        dx[n * C + c] += d[n * ld + o] * w[o * C + c] + d[n * ld + at + o] * w[(OC + o) * C + c];
        dw[o * C + c] += d[n * ld + at + o] * x[n * C + c];
      }
  std::vector<float> sum(N * C), gw(OC * C, 0.0f);
  host::matmul_input_grad(sum.data(), false, la.data(), wa.data(), N, C, OC, ld);
  host::matmul_input_grad(sum.data(), true, la.data() + at, wa.data() + OC * C, N, C, OC, ld);
  EXPECT_TRUE(all_close(sum, dx, 1e-4 * largest(dx), 1e-4)) << "the summed input gradient";
  host::matmul_backward(static_cast<A*>(nullptr), gw.data(), static_cast<float*>(nullptr),
                        la.data() + at, xa.data(), wa.data() + OC * C, N, C, OC, ld);
  EXPECT_TRUE(all_close(gw, dw, 1e-5, 1e-4)) << "dweight";
}

TYPED_TEST(NarrowKernels, LayerNormForwardAndBackward) {
  using A = TypeParam;
  const int64_t N = 6, C = 48;
  auto x = random_vector(N * C, 5, 2.0), w = random_vector(C, 6), b = random_vector(C, 7);
  for (auto& v : x) v += 3.0;
  auto g = random_vector(N * C, 8), d0 = random_vector(N * C, 9);
  const auto xa = narrow<A>(x), wa = narrow<A>(w), ba = narrow<A>(b), ga = narrow<A>(g);
  auto dinp = narrow<A>(d0);  // the residual gradient it accumulates into
  std::vector<double> y(N * C), dx = d0, dw(C, 0), db(C, 0);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double s = 1 / std::sqrt(v + 1e-5);
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[n * C + c] - m) * s;
      y[n * C + c] = xh * w[c] + b[c];
      mg += g[n * C + c] * w[c] / C;
      mgx += g[n * C + c] * w[c] * xh / C;
      dw[c] += g[n * C + c] * xh;
      db[c] += g[n * C + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[n * C + c] - m) * s;
      dx[n * C + c] += s * (g[n * C + c] * w[c] - mg - xh * mgx);
    }
  }
  std::vector<A> out(N * C);
  std::vector<float> mean(N), rstd(N), gw(C, 0), gb(C, 0);
  host::layernorm_forward(out.data(), mean.data(), rstd.data(), xa.data(), wa.data(), ba.data(), N,
                          C);
  EXPECT_TRUE(close16(out, y));
  host::layernorm_backward(dinp.data(), gw.data(), gb.data(), ga.data(), xa.data(), wa.data(),
                           mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(close16(dinp, dx)) << "dinp (accumulated, rounded once)";
  EXPECT_TRUE(all_close(gw, dw, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(gb, db, 1e-5, 1e-4));
}

TYPED_TEST(NarrowKernels, GeluResidualAndConvert) {
  using A = TypeParam;
  const int64_t n = 500;
  auto x = random_vector(n, 10, 2.0), g = random_vector(n, 11), r = random_vector(n, 12);
  const auto xa = narrow<A>(x), ga = narrow<A>(g), ra = narrow<A>(r);
  std::vector<double> y(n), dx(n), sum(n);
  const double k = std::sqrt(2 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double u = k * (x[i] + 0.044715 * x[i] * x[i] * x[i]), th = std::tanh(u);
    y[i] = 0.5 * x[i] * (1 + th);
    dx[i] = g[i] * (0.5 * (1 + th) + 0.5 * x[i] * (1 - th * th) * k * (1 + 3 * 0.044715 * x[i] * x[i]));
    sum[i] = x[i] + r[i];
  }
  std::vector<A> out(n), din(n), res(n), conv(n);
  host::gelu_forward(out.data(), xa.data(), n);
  host::gelu_backward(din.data(), xa.data(), ga.data(), n);
  host::residual_forward(res.data(), xa.data(), ra.data(), n);
  EXPECT_TRUE(close16(out, y));
  EXPECT_TRUE(close16(din, dx));
  EXPECT_TRUE(close16(res, sum));
  // The weight copy: each float master rounded once, to nearest.
  std::vector<float> master(n);
  for (int64_t i = 0; i < n; ++i) master[i] = static_cast<float>(g[i] * 1.000123);
  host::convert(conv.data(), master.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double m = master[i], c = static_cast<float>(conv[i]);
    ASSERT_LE(std::fabs(c - m), unit_roundoff<A>() * std::fabs(m)) << i;
  }
}

// [train] grad_dtype = bf16's adds, against the sums in double: a float
// gradient into a 16-bit sum is the float sum rounded to nearest A (within
// A's unit roundoff of it, plus float's for the float sum), a 16-bit part
// into a float rounds once to float (float's unit roundoff, 2^-24).
TYPED_TEST(NarrowKernels, AddIntoAcrossTypes) {
  using A = TypeParam;
  const int64_t n = 500;
  const auto a = random_vector(n, 30), f = random_vector(n, 31);
  std::vector<A> sums(n), parts(n);
  std::vector<float> floats(n), totals(n);
  for (int64_t i = 0; i < n; ++i) {
    sums[i] = A(static_cast<float>(a[i]));
    parts[i] = A(static_cast<float>(f[i]));
    floats[i] = static_cast<float>(f[i] * 0.37);
    totals[i] = static_cast<float>(a[i] * 1.5);
  }
  std::vector<double> want_s(n), want_t(n);
  for (int64_t i = 0; i < n; ++i) {
    want_s[i] = static_cast<double>(static_cast<float>(sums[i])) + floats[i];
    want_t[i] = static_cast<double>(totals[i]) + static_cast<float>(parts[i]);
  }
  host::add_into(sums.data(), floats.data(), n);
  host::add_into(totals.data(), parts.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(static_cast<float>(sums[i]) - want_s[i]),
              (unit_roundoff<A>() + 0x1p-24) * std::fabs(want_s[i]))
        << i;
    ASSERT_LE(std::fabs(totals[i] - want_t[i]), 0x1p-24 * std::fabs(want_t[i])) << i;
  }
}

TYPED_TEST(NarrowKernels, AttentionForwardAndBackward) {
  using A = TypeParam;
  // Several causal blocks, the last one short (host::head_gemm).
  const int64_t B = 2, T = 2 * host::kCausalBlock + 3, C = 16, NH = 2, hs = C / NH;
  auto qkv = random_vector(B * T * 3 * C, 13), dout = random_vector(B * T * C, 14);
  const auto qa = narrow<A>(qkv), da = narrow<A>(dout);
  std::vector<double> out(B * T * C, 0), dqkv(B * T * 3 * C, 0);
  // Sums of the terms' magnitudes: the scale of a product's error when its
  // terms' factors are rounded (and cancel).
  std::vector<double> out_mag(out.size(), 0), dqkv_mag(dqkv.size(), 0);
  const double scale = 1 / std::sqrt(static_cast<double>(hs));
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t c) {
    return (b * T + t) * 3 * C + part * C + h * hs + c;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      std::vector<double> P(T * T, 0), dP(T * T, 0);
      for (int64_t t = 0; t < T; ++t) {
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t c = 0; c < hs; ++c) s += qkv[at(b, t, 0, h, c)] * qkv[at(b, j, 1, h, c)];
          P[t * T + j] = s * scale;
          mx = std::max(mx, s * scale);
        }
        double z = 0;
        for (int64_t j = 0; j <= t; ++j) z += (P[t * T + j] = std::exp(P[t * T + j] - mx));
        for (int64_t j = 0; j <= t; ++j) P[t * T + j] /= z;
        for (int64_t c = 0; c < hs; ++c) {
          double o = 0;
          double mag = 0;
          for (int64_t j = 0; j <= t; ++j) {
            o += P[t * T + j] * qkv[at(b, j, 2, h, c)];
            mag += std::fabs(P[t * T + j] * qkv[at(b, j, 2, h, c)]);
          }
          out[(b * T + t) * C + h * hs + c] = o;
          out_mag[(b * T + t) * C + h * hs + c] = mag;
        }
      }
      // dP = dO V^T, dV = P^T dO, dS = P (dP - rowsum(P dP)), dQ = dS K s, dK = dS^T Q s.
      for (int64_t t = 0; t < T; ++t) {
        double rowdot = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t c = 0; c < hs; ++c)
            s += dout[(b * T + t) * C + h * hs + c] * qkv[at(b, j, 2, h, c)];
          dP[t * T + j] = s;
          rowdot += P[t * T + j] * s;
        }
        for (int64_t j = 0; j <= t; ++j) {
          const double dS = P[t * T + j] * (dP[t * T + j] - rowdot) * scale;
          for (int64_t c = 0; c < hs; ++c) {
            dqkv[at(b, t, 0, h, c)] += dS * qkv[at(b, j, 1, h, c)];
            dqkv[at(b, j, 1, h, c)] += dS * qkv[at(b, t, 0, h, c)];
            dqkv[at(b, j, 2, h, c)] += P[t * T + j] * dout[(b * T + t) * C + h * hs + c];
            dqkv_mag[at(b, t, 0, h, c)] += std::fabs(dS * qkv[at(b, j, 1, h, c)]);
            dqkv_mag[at(b, j, 1, h, c)] += std::fabs(dS * qkv[at(b, t, 0, h, c)]);
            dqkv_mag[at(b, j, 2, h, c)] +=
                std::fabs(P[t * T + j] * dout[(b * T + t) * C + h * hs + c]);
          }
        }
      }
    }
  std::vector<A> o(B * T * C), d(B * T * 3 * C);
  // NaN where nothing may be read: entries above the diagonal are skipped.
  std::vector<float> att(B * NH * T * T, std::nanf("")), datt(att.size(), std::nanf(""));
  host::attention_forward(o.data(), att.data(), qa.data(), B, T, C, NH, NH);
  host::attention_backward(d.data(), datt.data(), da.data(), qa.data(), att.data(), B, T, C, NH, NH);
  // The probabilities (forward) and the score gradients (backward) are
  // rounded to the format for the products that read them, as tensor cores
  // take them: each term of a product is off by up to u of itself, so the
  // bound is 1.5 u |want| plus u (with 2x room for the float work on dS)
  // times the sum of the terms' magnitudes.
  auto check = [](const std::vector<A>& got, const std::vector<double>& want,
                  const std::vector<double>& mag) {
    const double u = unit_roundoff<A>();
    for (size_t i = 0; i < got.size(); ++i) {
      const double g = static_cast<float>(got[i]);
      if (!(std::fabs(g - want[i]) <= 1.5 * u * std::fabs(want[i]) + 2 * u * mag[i] + 1e-7))
        return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want "
                                             << want[i] << " (terms' magnitude " << mag[i] << ")";
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(check(o, out, out_mag));
  EXPECT_TRUE(check(d, dqkv, dqkv_mag));
}

TYPED_TEST(NarrowKernels, CrossEntropyAndEmbedding) {
  using A = TypeParam;
  const int64_t N = 5, V = 11, Vp = 16, C = 8, T = 5;
  auto z = random_vector(N * Vp, 15, 3.0);
  const std::vector<int32_t> y = {3, 0, 10, 7, 7};
  auto za = narrow<A>(z);
  std::vector<double> loss(N), grad(N * Vp, 0);
  const double gs = 0.125 * 1024;  // a loss scale's worth: fp16 keeps it
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, z[n * Vp + i]);
    for (int64_t i = 0; i < V; ++i) s += std::exp(z[n * Vp + i] - mx);
    loss[n] = std::log(s) + mx - z[n * Vp + y[n]];
    for (int64_t i = 0; i < V; ++i)
      grad[n * Vp + i] = gs * (std::exp(z[n * Vp + i] - mx) / s - (i == y[n] ? 1 : 0));
  }
  std::vector<float> lf(N), lb(N);
  host::crossentropy_forward(lf.data(), za.data(), y.data(), N, V, Vp);
  host::crossentropy_forward_backward(lb.data(), za.data(), y.data(), N, V, Vp,
                                      static_cast<float>(gs));
  EXPECT_TRUE(all_close(lf, loss, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(lb, loss, 1e-5, 1e-5));
  EXPECT_TRUE(close16(za, grad)) << "dlogits, padding zero";

  // Embedding: rows plus positions, rounded once; gradients in float.
  auto wte = random_vector(V * C, 16), wpe = random_vector(T * C, 17), g = random_vector(N * C, 18);
  const auto ea = narrow<A>(wte), pa = narrow<A>(wpe), ga = narrow<A>(g);
  std::vector<double> e(N * C), dwte(V * C, 0), dwpe(T * C, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      e[n * C + c] = wte[y[n] * C + c] + wpe[n * C + c];
      dwte[y[n] * C + c] += g[n * C + c];
      dwpe[n * C + c] += g[n * C + c];
    }
  std::vector<A> out(N * C);
  std::vector<float> gte(V * C, 0), gpe(T * C, 0);
  host::embedding_forward(out.data(), y.data(), ea.data(), pa.data(), 1, N, C);
  host::embedding_backward(gte.data(), gpe.data(), ga.data(), y.data(), 1, N, C);
  EXPECT_TRUE(close16(out, e));
  EXPECT_TRUE(all_close(gte, dwte, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(gpe, dwpe, 1e-6, 1e-6));
}

// AdamW in mixed precision: the float masters are updated exactly as in
// fp32 (bit for bit), and the copy the matmuls read is each master rounded.
TYPED_TEST(NarrowKernels, AdamWUpdatesMastersAndRoundsTheCopy) {
  using A = TypeParam;
  const int64_t n = 3 * kAdamWChunkElements / 2;
  const auto p0 = cast<float>(random_vector(n, 19)), g = cast<float>(random_vector(n, 20));
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, n, true);
  const AdamWParams p{1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.5};
  std::vector<float> pf = p0, mf(n, 0.01f), vf(n, 0.02f);
  std::vector<float> pm = p0, mm = mf, vm = vf;
  std::vector<A> copy(n);
  host::adamw_update_chunks(pf.data(), g.data(), mf.data(), vf.data(), chunks.data(),
                            static_cast<int64_t>(chunks.size()), p);
  host::adamw_update_chunks(pm.data(), g.data(), mm.data(), vm.data(), chunks.data(),
                            static_cast<int64_t>(chunks.size()), p, copy.data());
  ASSERT_EQ(pf, pm);
  ASSERT_EQ(mf, mm);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[i].bits, A(pm[i]).bits) << i;
}

}  // namespace
}  // namespace mpiformer::test
