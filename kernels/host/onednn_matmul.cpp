#include "onednn_matmul.hpp"

#ifdef MPIFORMER_HAVE_DNNL
#include <atomic>
#include <cstring>
#include <unordered_map>

namespace mpiformer::host::onednn {

namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Set once oneDNN has had no matmul at all for a product (oneDNN 2.6 has
// no bf16 one on a CPU without AVX512): from then on every product goes
// the other way, which is correct everywhere.
std::atomic<bool> g_unusable{false};

bool signal_safe(const dnnl::matmul::primitive_desc& pd) {
  return std::strncmp(pd.impl_info_str(), "brg:", 4) == 0;
}

dnnl::matmul::primitive_desc describe(const dnnl::memory::desc& ad, const dnnl::memory::desc& bd,
                                      const dnnl::memory::desc& cd, float alpha, float beta,
                                      const dnnl::memory::desc* biasd) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(
      biasd != nullptr ? dnnl::matmul::desc(ad, bd, *biasd, cd) : dnnl::matmul::desc(ad, bd, cd),
      attr, engine());
}

}  // namespace

bool run_matmul(const dnnl::memory::desc& ad, const dnnl::memory::desc& bd,
                const dnnl::memory::desc& cd, float alpha, float beta, const void* a,
                const void* b, void* c, const void* bias) {
  if (g_unusable) return false;
  const dnnl::memory::desc biasd(dnnl::memory::dims{1, cd.dims()[1]}, ad.data_type(),
                                 dnnl::memory::dims{cd.dims()[1], 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = describe(ad, bd, cd, alpha, beta, bias != nullptr ? &biasd : nullptr);
  } catch (const dnnl::error&) {
    g_unusable = true;
    return false;
  }
  if (!signal_safe(pd)) return false;
  dnnl::stream s(engine());
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(ad, engine(), const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(bd, engine(), const_cast<void*>(b))},
      {DNNL_ARG_DST, dnnl::memory(cd, engine(), c)}};
  if (bias != nullptr)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(biasd, engine(), const_cast<void*>(bias)));
  dnnl::matmul(pd).execute(s, args);
  s.wait();
  return true;
}

bool matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
            dnnl::memory::data_type in, dnnl::memory::data_type out) {
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc ad(dims{m, k}, in, ta ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc bd(dims{k, n}, in, tb ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc cd(dims{m, n}, out, dims{ldc, 1});
  return run_matmul(ad, bd, cd, alpha, beta, a, b, c);
}

std::string implementation(dnnl::memory::data_type in) {
  using dims = dnnl::memory::dims;
  const int64_t n = 256;
  try {
    const auto pd = describe(dnnl::memory::desc(dims{n, n}, in, dims{n, 1}),
                             dnnl::memory::desc(dims{n, n}, in, dims{n, 1}),
                             dnnl::memory::desc(dims{n, n}, dnnl::memory::data_type::f32,
                                                dims{n, 1}),
                             1.0f, 0.0f, nullptr);
    return signal_safe(pd) ? pd.impl_info_str() : "";
  } catch (const dnnl::error&) {
    return "";
  }
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

}  // namespace mpiformer::host::onednn
#endif
