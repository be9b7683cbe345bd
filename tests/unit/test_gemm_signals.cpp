// The host's products while signals arrive mid-kernel. A rank takes SIGUSR1
// or SIGTERM in the middle of a step (a preemption: it checkpoints after the
// step), so a product must come out of a handled signal with the right
// numbers and the heap intact. A kernel that points the stack register at
// the heap while it runs (oneDNN 2.x's generated sgemm, behind dnnl_sgemm:
// onednn_matmul.hpp) has each handler's frame written into the heap; with
// it, this test aborted in free() ("corrupted size vs. prev_size") within
// its first second, as ranks of the suite's preemption tests had died.
//
// A timer raises SIGALRM every 50 us (a handler that counts, as the stop
// handlers only set a flag) while the fp32 and bf16 products of a linear
// layer (forward x W^T, input gradient dy W, weight gradient dy^T x) and of
// an attention head run over and over, each with fresh heap buffers so a
// damaged heap shows in the next allocation. Every result is checked
// against a double-precision loop over the same (16-bit: already rounded)
// inputs. Tolerance 1e-4 absolute: the inputs are in [-1, 1], at most 384
// products a sum, float accumulation (about 384 x 6e-8 = 2.3e-5 at worst).
// The test also requires the signals to have arrived while products ran.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <random>
#include <vector>

#include "host/gemm.hpp"

namespace mpiformer {
namespace {

volatile std::sig_atomic_t g_alarms = 0;
extern "C" void count_alarm(int) { g_alarms = g_alarms + 1; }

// SIGALRM every `period_us` for the scope's life; the previous handler and
// timer come back after it.
class AlarmStorm {
 public:
  explicit AlarmStorm(long period_us) {
    struct sigaction sa {};
    sa.sa_handler = count_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, &previous_);
    const itimerval t{{0, period_us}, {0, period_us}};
    setitimer(ITIMER_REAL, &t, &previous_timer_);
  }
  ~AlarmStorm() {
    setitimer(ITIMER_REAL, &previous_timer_, nullptr);
    sigaction(SIGALRM, &previous_, nullptr);
  }

 private:
  struct sigaction previous_ {};
  itimerval previous_timer_{};
};

struct Shape {
  bool ta, tb;
  int64_t m, n, k;
};

// C = op(A) op(B) in double from A's and B's float values (row-major,
// dense: lda = op(A)'s stored width).
std::vector<double> reference(const Shape& s, const std::vector<float>& a,
                              const std::vector<float>& b) {
  std::vector<double> c(static_cast<size_t>(s.m * s.n), 0.0);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = s.ta ? a[p * s.m + i] : a[i * s.k + p];
        const double y = s.tb ? b[j * s.k + p] : b[p * s.n + j];
        sum += x * y;
      }
      c[i * s.n + j] = sum;
    }
  return c;
}

// Repeats each shape's product in element type A (float output) for about
// `seconds` under the storm; returns the worst error over every repeat.
template <class A>
double worst_error_under_signals(const std::vector<Shape>& shapes, double seconds) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  double worst = 0.0;
  for (const Shape& s : shapes) {
    std::vector<float> af(static_cast<size_t>(s.m * s.k)), bf(static_cast<size_t>(s.k * s.n));
    for (auto* v : {&af, &bf})
      for (float& x : *v) x = static_cast<float>(A(u(gen)));  // exact in A
    const std::vector<double> want = reference(s, af, bf);
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    AlarmStorm storm(50);
    do {
      // Fresh buffers each time: a heap damaged by the last product fails here.
      std::vector<A> a(af.size()), b(bf.size());
      for (size_t i = 0; i < af.size(); ++i) a[i] = A(af[i]);
      for (size_t i = 0; i < bf.size(); ++i) b[i] = A(bf[i]);
      std::vector<float> c(want.size(), 0.0f);
      host::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(),
                 s.n);
      for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::fabs(c[i] - want[i]));
    } while (std::chrono::steady_clock::now() < until);
  }
  return worst;
}

// A linear layer of 256 tokens, 128 -> 384 features, and one attention
// head of 64 positions and 32 channels (scores q k^T, then p v).
const std::vector<Shape> kShapes = {{false, true, 256, 384, 128},
                                    {false, false, 256, 128, 384},
                                    {true, false, 384, 128, 256},
                                    {false, true, 64, 64, 32},
                                    {false, false, 64, 32, 64}};

TEST(GemmSignals, ProductsSurviveSignalsArrivingMidKernel) {
  g_alarms = 0;
  const double fp32 = worst_error_under_signals<float>(kShapes, 0.2);
  const double bf16 = worst_error_under_signals<host::Bf16>(kShapes, 0.2);
  EXPECT_LT(fp32, 1e-4) << host::gemm_engine();
  EXPECT_LT(bf16, 1e-4);
  // 2 s of products at one signal each 50 us: thousands arrive; fewer
  // than 1,000 would mean the storm did not run.
  EXPECT_GT(static_cast<int>(g_alarms), 1000);
  std::printf("%d signals handled during the products (fp32 through %s); worst errors %.1e, "
              "%.1e\n",
              static_cast<int>(g_alarms), host::gemm_engine().c_str(), fp32, bf16);
}

}  // namespace
}  // namespace mpiformer
