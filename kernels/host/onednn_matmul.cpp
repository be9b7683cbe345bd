#include "onednn_matmul.hpp"

#ifdef MPIFORMER_HAVE_DNNL
#include <atomic>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

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

// A product's primitive and its memory objects, kept per thread for each
// shape, strides, types, scaling and bias seen: setting the operands' data
// handles costs far less than describing the product again (oneDNN's own
// cache still hashes the descriptors and builds the memory objects: about
// 9 us a call, more than a 64 x 64 x 32 product, and attention's ring makes
// thousands of those a step).
struct Prepared {
  bool usable = false;
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias;
};

std::unordered_map<std::string, Prepared>& thread_cache() {
  thread_local std::unordered_map<std::string, Prepared> cache;
  return cache;
}

Prepared* prepare(const dnnl::memory::desc& ad, const dnnl::memory::desc& bd,
                  const dnnl::memory::desc& cd, float alpha, float beta, bool with_bias) {
  std::unordered_map<std::string, Prepared>& cache = thread_cache();
  std::string key;
  for (const dnnl::memory::desc* d : {&ad, &bd, &cd})
    key.append(reinterpret_cast<const char*>(&d->data), sizeof d->data);
  key.append(reinterpret_cast<const char*>(&alpha), sizeof alpha);
  key.append(reinterpret_cast<const char*>(&beta), sizeof beta);
  key.push_back(with_bias ? 'b' : '-');
  // A run makes a few hundred shapes; the bound only keeps a caller of
  // ever-new shapes (a benchmark sweep) from holding them all.
  if (cache.size() >= 4096 && cache.find(key) == cache.end()) cache.clear();
  const auto [it, fresh] = cache.try_emplace(std::move(key));
  Prepared& p = it->second;
  if (!fresh) return &p;
  const dnnl::memory::desc biasd(dnnl::memory::dims{1, cd.dims()[1]}, ad.data_type(),
                                 dnnl::memory::dims{cd.dims()[1], 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = describe(ad, bd, cd, alpha, beta, with_bias ? &biasd : nullptr);
  } catch (const dnnl::error&) {
    g_unusable = true;
    return &p;
  }
  if (!signal_safe(pd)) return &p;
  p.primitive = dnnl::matmul(pd);
  p.a = dnnl::memory(ad, engine(), DNNL_MEMORY_NONE);
  p.b = dnnl::memory(bd, engine(), DNNL_MEMORY_NONE);
  p.c = dnnl::memory(cd, engine(), DNNL_MEMORY_NONE);
  if (with_bias) p.bias = dnnl::memory(biasd, engine(), DNNL_MEMORY_NONE);
  p.usable = true;
  return &p;
}

}  // namespace

bool run_matmul(const dnnl::memory::desc& ad, const dnnl::memory::desc& bd,
                const dnnl::memory::desc& cd, float alpha, float beta, const void* a,
                const void* b, void* c, const void* bias) {
  if (g_unusable) return false;
  Prepared* p = prepare(ad, bd, cd, alpha, beta, bias != nullptr);
  if (!p->usable) return false;
  thread_local dnnl::stream s(engine());
  p->a.set_data_handle(const_cast<void*>(a));
  p->b.set_data_handle(const_cast<void*>(b));
  p->c.set_data_handle(c);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
  if (bias != nullptr) {
    p->bias.set_data_handle(const_cast<void*>(bias));
    args.emplace(DNNL_ARG_BIAS, p->bias);
  }
  p->primitive.execute(s, args);
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

void forget_primitives() {
  // Every thread that computes: the caller and OpenMP's team (the products
  // of a parallel region's threads are theirs).
  thread_cache().clear();
#pragma omp parallel
  thread_cache().clear();
  const int capacity = dnnl::get_primitive_cache_capacity();
  dnnl::set_primitive_cache_capacity(0);
  dnnl::set_primitive_cache_capacity(capacity);
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
