// The MPI communicator and the process grid, run at 1, 2 and 4 ranks. Data
// is small integers, so every sum is exact in fp32 whatever the order: the
// checks are equalities.
#include "core/bf16.hpp"
#include "core/fp16.hpp"
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "parallel/mpi_communicator.hpp"
#include "parallel/process_grid.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

MpiCommunicator world_copy() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return MpiCommunicator(c);
}

TEST(MpiCommunicator, AllreduceBlockingAndNonBlockingAreExact) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) a[i] = b[i] = static_cast<float>((r + 1) * (i % 7));
  comm.allreduce_sum(a.data(), 1000);
  comm.start_allreduce_sum(b.data(), 1000)->wait();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(a[i], ranks_sum * static_cast<float>(i % 7));
    ASSERT_EQ(b[i], a[i]);
  }
  double d = r + 0.5;
  comm.allreduce_sum(&d, 1);
  EXPECT_EQ(d, n * (n - 1) / 2.0 + 0.5 * n);
}

// Expert parallelism's exchange: rank r sends rank q (r + 1) (q + 2) - 2
// bytes (none from rank 0 to rank 0), byte i of it r * 16 + q + i; the
// sizes exchanged first.
TEST(MpiCommunicator, AlltoallvDeliversEveryBlockToItsRank) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  auto bytes = [](int from, int to) { return int64_t{from + 1} * (to + 2) - 2; };
  auto value = [](int from, int to, int64_t i) {
    return static_cast<unsigned char>(from * 16 + to + i);
  };
  std::vector<int64_t> out_counts;
  std::vector<unsigned char> send;
  for (int q = 0; q < n; ++q) {
    out_counts.push_back(bytes(r, q));
    for (int64_t i = 0; i < bytes(r, q); ++i) send.push_back(value(r, q, i));
  }
  const std::vector<int64_t> in_counts = exchange_counts(comm, out_counts);
  for (int q = 0; q < n; ++q) ASSERT_EQ(in_counts[q], bytes(q, r));
  int64_t total = 0;
  for (const int64_t c : in_counts) total += c;
  std::vector<unsigned char> recv(static_cast<size_t>(total), 0xEE);
  comm.alltoallv_bytes(send.data(), out_counts, recv.data(), in_counts);
  int64_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < bytes(q, r); ++i, ++at)
      ASSERT_EQ(recv[static_cast<size_t>(at)], value(q, r, i)) << "from " << q << ", byte " << i;
}

// ZeRO's parts are unequal (they end at tensor rows) and may be empty.
std::vector<int64_t> uneven_parts(int n) {
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(r == 1 ? 0 : 3 + 5 * r);
  return counts;
}

// Where rank r's part starts, and the parts' total.
std::pair<int64_t, int64_t> place_of(const std::vector<int64_t>& counts, int r) {
  int64_t at = 0, total = 0;
  for (int q = 0; q < static_cast<int>(counts.size()); ++q) {
    if (q < r) at += counts[q];
    total += counts[q];
  }
  return {at, total};
}

TEST(MpiCommunicator, ReduceScatterOfUnevenPartsIsExact) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  const std::vector<int64_t> counts = uneven_parts(n);
  const auto [mine_at, total] = place_of(counts, r);
  std::vector<float> send(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) send[i] = static_cast<float>((r + 1) * (i % 5));
  std::vector<float> recv(static_cast<size_t>(counts[r]) + 1, -7.0f);  // + a guard element
  comm.start_reduce_scatter_sum(send.data(), recv.data(), counts)->wait();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int64_t i = 0; i < counts[r]; ++i)
    ASSERT_EQ(recv[i], ranks_sum * static_cast<float>((mine_at + i) % 5)) << i;
  EXPECT_EQ(recv.back(), -7.0f);
}

// bf16 parts ([train] grad_dtype): 16 bits travel, each pair summed as
// values (bits summed as integers, MPI_SUM on MPI_UINT16_T, would give
// nonsense). Small integers, whose every partial sum is a bf16, make any
// order give the exact sum. In place (recv is this rank's own part of
// send) and apart.
TEST(MpiCommunicator, ReduceScatterOfBf16PartsSumsAndRounds) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  const std::vector<int64_t> counts = uneven_parts(n);
  const auto [mine_at, total] = place_of(counts, r);
  auto value = [&](int64_t i) { return static_cast<float>((r + 1) * (i % 5)); };
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "apart");
    std::vector<uint16_t> send(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i) send[i] = float_to_bf16(value(i));
    std::vector<uint16_t> apart(static_cast<size_t>(counts[r]) + 1, 0xffff);  // + a guard
    uint16_t* recv = in_place ? send.data() + mine_at : apart.data();
    comm.start_reduce_scatter_sum(send.data(), recv, counts, Element::kBf16)->wait();
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int64_t i = 0; i < counts[r]; ++i)
      ASSERT_EQ(bf16_to_float(recv[i]), ranks_sum * static_cast<float>((mine_at + i) % 5)) << i;
    if (!in_place) EXPECT_EQ(apart.back(), 0xffff);
  }
}

TEST(MpiCommunicator, AllgatherOfUnevenPartsInPlaceAndNot) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  const std::vector<int64_t> counts = uneven_parts(n);
  const auto [mine_at, total] = place_of(counts, r);
  auto value = [](int64_t i) { return static_cast<float>(i * 3 + 1); };
  // Apart: from a buffer of this rank's part alone; floats.
  std::vector<float> part(static_cast<size_t>(counts[r]) + 1);
  for (int64_t i = 0; i < counts[r]; ++i) part[i] = value(mine_at + i);
  std::vector<float> all(static_cast<size_t>(total), -1.0f);
  comm.start_allgather(part.data(), all.data(), counts, sizeof(float))->wait();
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(all[i], value(i));
  // In place, 2-byte elements (bf16 weights travel so).
  std::vector<uint16_t> bits(static_cast<size_t>(total), 0);
  for (int64_t i = 0; i < counts[r]; ++i) bits[mine_at + i] = static_cast<uint16_t>(mine_at + i + 40000);
  comm.start_allgather(bits.data() + mine_at, bits.data(), counts, 2)->wait();
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(bits[i], static_cast<uint16_t>(i + 40000));
}

TEST(MpiCommunicator, RingSendReceive) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> out(64, static_cast<float>(r)), in(64, -1.0f);
  auto sent = comm.start_send(out.data(), 64, (r + 1) % n, 7);
  comm.recv(in.data(), 64, (r + n - 1) % n, 7);
  sent->wait();
  for (float v : in) ASSERT_EQ(v, static_cast<float>((r + n - 1) % n));
}

// A ring's steps (train/ring_attention.hpp): every rank passes the block
// it holds to the next while the previous rank's arrives, the send and
// the receive started together, until each block has visited every rank.
// Blocks large enough to go by rendezvous, not eagerly.
TEST(MpiCommunicator, RingExchangePassesEveryBlockRound) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> held(100000, static_cast<float>(r)), arriving(held.size(), -1.0f);
  for (int s = 1; s < n; ++s) {
    comm.start_exchange_bytes(held.data(), arriving.data(), sizeof(float) * held.size(), (r + 1) % n,
                              (r + n - 1) % n, s % 2)
        ->wait();
    for (float v : arriving) ASSERT_EQ(v, static_cast<float>((r - s + n) % n)) << "step " << s;
    std::swap(held, arriving);
  }
}

TEST(MpiCommunicator, AllreduceOfEachTypeAndReduction) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> f(100);
  std::vector<double> d(100);
  for (int i = 0; i < 100; ++i) f[i] = static_cast<float>(d[i] = (r + 1) * (i % 5) - r);
  std::vector<float> fmax = f;
  comm.allreduce(f.data(), 100, Element::kF32, Reduction::kSum);
  comm.allreduce(d.data(), 100, Element::kF64, Reduction::kSum);
  comm.allreduce(fmax.data(), 100, Element::kF32, Reduction::kMax);
  for (int i = 0; i < 100; ++i) {
    double sum = 0, mx = -1e30;
    for (int q = 0; q < n; ++q) {
      sum += (q + 1) * (i % 5) - q;
      mx = std::max(mx, static_cast<double>((q + 1) * (i % 5) - q));
    }
    ASSERT_EQ(f[i], static_cast<float>(sum));
    ASSERT_EQ(d[i], sum);
    ASSERT_EQ(fmax[i], static_cast<float>(mx));
  }
  // 16-bit floats: summed in float and rounded once, the same bits on every
  // rank. Values chosen so the exact sums are representable in each format
  // (small integers and halves), so the expected bits are the exact sums.
  std::vector<uint16_t> b(100), h(100);
  for (int i = 0; i < 100; ++i) {
    const float x = 0.5f * static_cast<float>((r + 1) * (i % 7)) - static_cast<float>(r);
    b[i] = float_to_bf16(x);
    h[i] = float_to_fp16(x);
  }
  comm.allreduce(b.data(), 100, Element::kBf16, Reduction::kSum);
  comm.allreduce(h.data(), 100, Element::kF16, Reduction::kSum);
  for (int i = 0; i < 100; ++i) {
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += 0.5 * (q + 1) * (i % 7) - q;
    ASSERT_EQ(bf16_to_float(b[i]), static_cast<float>(sum)) << i;
    ASSERT_EQ(fp16_to_float(h[i]), static_cast<float>(sum)) << i;
  }
}

// Sequence parallelism's pair, equal parts, in each element type: the sum
// of this rank's part lands in recv and nothing past it (blocking and
// started); the started all-reduce sums every element; the all-gather
// puts every part in its place, from apart and in place. Exact values
// (small integers and halves), so the checks are equalities.
TEST(MpiCommunicator, TypedReduceScatterAndAllgatherOfEqualParts) {
  MpiCommunicator comm = world_copy();
  const int n = comm.size(), r = comm.rank();
  const int64_t part = 37;
  auto value = [&](int q, int64_t i) { return 0.5f * static_cast<float>((q + 1) * (i % 7)) - q; };
  auto sum_over_ranks = [&](int64_t i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += value(q, i);
    return static_cast<float>(s);
  };
  for (const Element e : {Element::kF32, Element::kF64, Element::kBf16, Element::kF16}) {
    const size_t eb = element_bytes(e);
    auto store = [&](std::vector<char>& buf, int64_t i, float x) {
      char* at = buf.data() + eb * static_cast<size_t>(i);
      if (e == Element::kF32) std::memcpy(at, &x, 4);
      if (e == Element::kF64) { const double d = x; std::memcpy(at, &d, 8); }
      if (e == Element::kBf16 || e == Element::kF16) {
        const uint16_t b = e == Element::kBf16 ? float_to_bf16(x) : float_to_fp16(x);
        std::memcpy(at, &b, 2);
      }
    };
    auto load = [&](const std::vector<char>& buf, int64_t i) -> double {
      const char* at = buf.data() + eb * static_cast<size_t>(i);
      float f = 0;
      double d = 0;
      uint16_t b = 0;
      if (e == Element::kF32) return std::memcpy(&f, at, 4), f;
      if (e == Element::kF64) return std::memcpy(&d, at, 8), d;
      std::memcpy(&b, at, 2);
      return e == Element::kBf16 ? bf16_to_float(b) : fp16_to_float(b);
    };
    std::vector<char> send(eb * static_cast<size_t>(part * n)), recv(eb * static_cast<size_t>(part + 1));
    for (int64_t i = 0; i < part * n; ++i) store(send, i, value(r, i));
    store(recv, part, -7.0f);  // a guard element
    comm.reduce_scatter(send.data(), recv.data(), part, e);
    for (int64_t i = 0; i < part; ++i)
      ASSERT_EQ(load(recv, i), sum_over_ranks(r * part + i)) << element_name(e) << " " << i;
    EXPECT_EQ(load(recv, part), -7.0) << element_name(e);
    // Started, then waited for: the same sums (16-bit ones rounded at the
    // wait, into the caller's buffer).
    std::vector<char> started(recv.size());
    store(started, part, -7.0f);
    Pending rs = comm.start_reduce_scatter(send.data(), started.data(), part, e);
    rs->wait();
    EXPECT_EQ(started, recv) << element_name(e);
    std::vector<char> summed = send;
    comm.start_allreduce(summed.data(), part * n, e)->wait();
    for (int64_t i = 0; i < part * n; ++i)
      ASSERT_EQ(load(summed, i), sum_over_ranks(i)) << element_name(e) << " " << i;
    // A 16-bit sum is widened into one kept buffer (counted by the
    // accounting): a second started while the first is in flight is
    // refused, and the buffer is free again once the first is waited for.
    if (eb == 2) {
      std::vector<char> again = send;
      Pending first = comm.start_allreduce(summed.data(), part * n, e);
      EXPECT_THROW(comm.start_allreduce(again.data(), part * n, e), std::logic_error);
      first->wait();
      comm.start_allreduce(again.data(), part * n, e)->wait();
    }
    // All-gather, from apart, then in place.
    std::vector<char> all(eb * static_cast<size_t>(part * n));
    for (int64_t i = 0; i < part; ++i) store(recv, i, static_cast<float>(r * part + i));
    comm.allgather(recv.data(), all.data(), part, e);
    for (int64_t i = 0; i < part * n; ++i) ASSERT_EQ(load(all, i), static_cast<double>(i)) << i;
    std::vector<char> inplace(all.size(), 0);
    std::memcpy(inplace.data() + eb * static_cast<size_t>(r * part), recv.data(), eb * part);
    comm.allgather(inplace.data() + eb * static_cast<size_t>(r * part), inplace.data(), part, e);
    EXPECT_EQ(inplace, all) << element_name(e);
  }
}

// float_to_fp16 against values whose half is known by construction: every
// finite half widened and narrowed again is itself; halfway points round to
// even; the overflow threshold 65520 goes to infinity; NaN stays NaN.
TEST(Fp16, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      const uint16_t back = float_to_fp16(fp16_to_float(h));
      ASSERT_TRUE((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0) << bits;
      continue;
    }
    ASSERT_EQ(float_to_fp16(fp16_to_float(h)), h) << bits;
  }
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 0.5f / 1024)), 1.0f);  // tie: to even (down)
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.5f / 1024)), 1.0f + 2.0f / 1024);  // tie: up
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(65520.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -26))), 0.0f);  // below half the least
  // The conversions in use (F16C's where the build targets it) against the
  // portable bit versions: every half, and floats spread over every
  // exponent (NaNs only need to stay NaN).
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float a = fp16_to_float(static_cast<uint16_t>(bits));
    const float b = fp16_to_float_bits(static_cast<uint16_t>(bits));
    ASSERT_TRUE(std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b))) << bits;
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 65521) {
    const auto bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16(f), float_to_fp16_bits(f)) << bits;
  }
}

// Every factorisation dp x pp x tp of the world: the place of each rank
// (tp fastest, then dp, then pp) and the members of each group.
TEST(ProcessGrid, EveryFactorisationOfTheWorld) {
  const int world = world_size();
  for (int tp = 1; tp <= world; ++tp) {
    for (int dp = 1; dp * tp <= world; ++dp) {
      if (world % (dp * tp) != 0) continue;
      const int pp = world / (dp * tp);
      ProcessGrid g(dp, pp, tp);
      const int r = g.world_rank();
      EXPECT_EQ(g.tp_rank(), r % tp);
      EXPECT_EQ(g.dp_rank(), (r / tp) % dp);
      EXPECT_EQ(g.stage(), r / (dp * tp));
      EXPECT_EQ(g.rank_of_stage(g.stage()), r);
      EXPECT_EQ(g.data_parallel().size(), dp);
      EXPECT_EQ(g.data_parallel().rank(), g.dp_rank());
      EXPECT_EQ(g.pipeline().size(), pp);
      EXPECT_EQ(g.pipeline().rank(), g.stage());
      EXPECT_EQ(g.tensor_parallel().size(), tp);
      EXPECT_EQ(g.tensor_parallel().rank(), g.tp_rank());
      EXPECT_EQ(g.stage_group().size(), dp * tp);
      // A tensor group is neighbouring ranks of one stage and replica; a
      // data-parallel group shares a stage and tensor rank; a pipeline
      // shares a replica and tensor rank.
      double mine[3] = {static_cast<double>(r), static_cast<double>(r), static_cast<double>(r)};
      g.tensor_parallel().allreduce_sum(&mine[0], 1);
      g.data_parallel().allreduce_sum(&mine[1], 1);
      g.pipeline().allreduce_sum(&mine[2], 1);
      const int first = r - g.tp_rank();
      EXPECT_EQ(mine[0], tp * first + tp * (tp - 1) / 2.0);
      double dp_sum = 0, pp_sum = 0;
      for (int k = 0; k < dp; ++k) dp_sum += grid_rank({g.stage(), k, g.tp_rank()}, dp, tp);
      for (int s = 0; s < pp; ++s) pp_sum += g.rank_of_stage(s);
      EXPECT_EQ(mine[1], dp_sum);
      EXPECT_EQ(mine[2], pp_sum);
      const bool holds_wte = pp > 1 && (g.first_stage() || g.last_stage());
      ASSERT_EQ(g.tied_embedding() != nullptr, holds_wte);
      if (holds_wte) {
        EXPECT_EQ(g.tied_embedding()->size(), 2);
        EXPECT_EQ(g.tied_embedding()->rank(), g.first_stage() ? 0 : 1);
        double partner = r;
        g.tied_embedding()->allreduce_sum(&partner, 1);
        EXPECT_EQ(partner, g.rank_of_stage(0) + g.rank_of_stage(pp - 1));
      }
    }
  }
}

// Context parallelism: every factorisation dp x pp x tp x cp. The stage's
// replicas are dp x cp (the data-parallel group), a data replica's cp
// ranks neighbours among them (replica = data replica x cp + context
// rank); the context group shares a stage, a data replica and a tensor
// rank, its group rank the context rank.
TEST(ProcessGrid, ContextRanksAreNeighbouringReplicas) {
  const int world = world_size();
  for (int cp = 2; cp <= world; ++cp) {
    for (int tp = 1; tp * cp <= world; ++tp) {
      for (int dp = 1; dp * tp * cp <= world; ++dp) {
        if (world % (dp * tp * cp) != 0) continue;
        const int pp = world / (dp * tp * cp);
        ProcessGrid g(dp, pp, tp, MPI_COMM_WORLD, 1, 1, cp);
        const int r = g.world_rank();
        EXPECT_EQ(g.dp(), dp * cp);
        EXPECT_EQ(g.cp(), cp);
        EXPECT_EQ(g.dp_rank(), (r / tp) % (dp * cp));
        EXPECT_EQ(g.data_parallel().size(), dp * cp);
        EXPECT_EQ(g.context_parallel().size(), cp);
        EXPECT_EQ(g.context_parallel().rank(), g.dp_rank() % cp);
        // Its members: the same stage, data replica and tensor rank, the
        // context rank running over them (ranks tp apart).
        double sum = r;
        g.context_parallel().allreduce_sum(&sum, 1);
        const int first = r - (g.dp_rank() % cp) * tp;
        EXPECT_EQ(sum, cp * first + tp * cp * (cp - 1) / 2.0)
            << "dp " << dp << " pp " << pp << " tp " << tp << " cp " << cp;
      }
    }
  }
}

}  // namespace
}  // namespace mpiformer::test
