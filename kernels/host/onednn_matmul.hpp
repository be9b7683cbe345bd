// oneDNN's matmul primitive, the one road into oneDNN for the fp32
// products (gemm.cpp) and the bf16 ones (gemm_narrow.cpp). Built only with
// oneDNN (MPIFORMER_HAVE_DNNL); internal to the host kernels.
#pragma once
#ifdef MPIFORMER_HAVE_DNNL
#include <cstdint>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

namespace mpiformer::host::onednn {

// dst = alpha src x weights + beta dst (+ a bias row of dst's width, in
// the inputs' type, added before dst's single rounding), for any
// descriptors. False where the product must go another way: oneDNN has no
// implementation for them, or only one that is not signal-safe.
//
// Signal-safe: oneDNN's generated GEMM kernels ("gemm:jit", also behind
// dnnl_sgemm) point the stack register at a heap buffer while they run
// (oneDNN issue 4845, fixed in 3.x; Debian 12 ships 2.6): a signal handled
// meanwhile writes its frame into the heap. mpiformer's ranks take SIGUSR1
// and SIGTERM mid-step (a preemption checkpoints), and a rank of the test
// suite died in free() that way. Only brgemm implementations ("brg:") run
// here; GemmSignals.ProductsSurviveSignalsArrivingMidKernel checks them.
bool run_matmul(const dnnl::memory::desc& ad, const dnnl::memory::desc& bd,
                const dnnl::memory::desc& cd, float alpha, float beta, const void* a,
                const void* b, void* c, const void* bias = nullptr);

// C = alpha op(A) op(B) + beta C, all row-major: the transposes are
// strides of the operands' descriptors (nothing is copied), beta a sum
// post-op. oneDNN caches the primitive of each shape.
bool matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
            dnnl::memory::data_type in, dnnl::memory::data_type out);

// Drops every product's primitive kept so far (this file's per-thread
// ones on the caller's and OpenMP's threads, and oneDNN's own cache), with
// their generated code: what the next products hold is theirs alone.
void forget_primitives();

// "brg:avx512_core" and the like for a square product of `in` with float
// output, or "" where run_matmul would refuse it.
std::string implementation(dnnl::memory::data_type in);

// "oneDNN 2.6.3"
std::string version();

}  // namespace mpiformer::host::onednn
#endif
