// cuBLAS GEMM against the host GEMM for every transpose combination, on
// random inputs, with the output poisoned first so unwritten elements fail.
// Tolerance: fp32 with K = 96 products per element, 1e-5 relative plus 1e-5
// absolute (TF32 is not enabled, so cuBLAS computes in full fp32).
// Also: the peak-FLOPs measurement leaves the allocator's peak alone.
// Without a GPU it exits 77, which CTest reports as skipped.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "cuda/gemm.hpp"
#include "host/gemm.hpp"

int main() {
  using namespace mpiformer;
  std::string why;
  if (cuda::device_count(&why) == 0) {
    std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  const int64_t M = 70, N = 50, K = 96;
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  std::vector<float> a(M * K), b(K * N);
  for (auto& x : a) x = dist(gen);
  for (auto& x : b) x = dist(gen);
  cuda::Blas blas;
  cuda::DeviceBuffer<float> da(a.size()), db(b.size()), dc(M * N);
  cuda::copy_to_device(da.get(), a.data(), a.size() * 4);
  cuda::copy_to_device(db.get(), b.data(), b.size() * 4);
  int failures = 0;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<float> want(M * N, 0.f), got(M * N, std::nanf(""));
      host::gemm(ta, tb, M, N, K, 1.f, a.data(), lda, b.data(), ldb, 0.f, want.data(), N);
      cuda::copy_to_device(dc.get(), got.data(), got.size() * 4);
      blas.gemm(ta, tb, M, N, K, 1.f, da.get(), lda, db.get(), ldb, 0.f, dc.get(), N);
      cuda::copy_to_host(got.data(), dc.get(), got.size() * 4);
      for (size_t i = 0; i < got.size(); ++i) {
        if (!(std::fabs(got[i] - want[i]) <= 1e-5f + 1e-5f * std::fabs(want[i]))) {
          std::printf("FAIL trans_a=%d trans_b=%d element %zu: got %g want %g\n", ta, tb, i,
                      got[i], want[i]);
          ++failures;
          break;
        }
      }
    }
  std::printf("%s: cuBLAS gemm vs host gemm, 4 transpose cases\n", failures ? "FAILED" : "passed");
  // The peak-FLOPs measurement's operands (3 x 4096^2 bf16 here, a second
  // Blas's workspace) are not the run's memory: the allocator's peak, which
  // the memory report compares with the accounting, must not count them.
  const size_t peak_before = cuda::device_allocated_peak();
  const double flops = cuda::measure_gemm_peak(cuda::DType::BF16, 4096, 1);
  const size_t peak_after = cuda::device_allocated_peak();
  const bool peak_ok = peak_after == peak_before && flops > 0;
  std::printf("%s: the peak-FLOPs GEMM (%.1f TFLOP/s) left the allocator's peak at %zu bytes "
              "(was %zu)\n", peak_ok ? "passed" : "FAILED", flops / 1e12, peak_after, peak_before);
  return failures || !peak_ok ? 1 : 0;
}
