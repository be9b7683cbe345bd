// The router: a thread per token for the softmax, top-k and dispatch rows;
// a block per (sequence, expert) for the capacity pass (each expert's
// places by a scan over the sequence's assignments in order) and its aux
// term; one block for the rows' prefix over (expert, sequence) (E x S
// steps, on one thread) and the totals, each summed in a fixed order.
// Under context parallelism the capacity pass is two: a block per
// (sequence, expert) counts this rank's assignments per (choice, chunk),
// the context group gathers every rank's counts, and a block per
// (sequence, expert) places this rank's after the cells before them
// (host/moe_router.hpp's router_capacity_context, the same pieces).
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/moe_router.hpp"

namespace mpiformer::cuda {

namespace {

// The arithmetic is common/moe_routing.hpp's, shared with the host.
__global__ void softmax_topk_kernel(RouterShape r, const float* logits, float* probs, float* lse,
                                    int32_t* expert, float* gate) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t E = r.experts, K = r.top_k;
  router_token(logits + n * E, probs + n * E, lse[n], expert + n * K, gate + n * K, E, K);
}

// A block per (sequence, expert): the expert's places in its queue by a
// scan over the sequence's assignments in capacity order, its count, drops
// and aux term (the probabilities summed over the sequence in a fixed
// order).
__global__ void capacity_kernel(RouterShape r, const float* probs, const int32_t* expert,
                                int32_t* dest, int32_t* chose, double* terms, int64_t* drops) {
  __shared__ int counts[kWarp];
  __shared__ float sums[kWarp];
  const int64_t s = blockIdx.x, e = blockIdx.y, L = r.seq_len, E = r.experts, LK = L * r.top_k;
  int64_t placed = 0;
  for (int64_t i0 = 0; i0 < LK; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x;
    const int64_t a = i < LK ? router_assignment(r, s, i) : 0;
    const int mine = i < LK && expert[a] == e ? 1 : 0;
    int total = 0;
    const int before = block_exclusive_count(mine, counts, &total);
    if (mine) dest[a] = router_dest(r, placed + before);
    placed += total;
  }
  float sum = 0.f;
  for (int64_t t = threadIdx.x; t < L; t += blockDim.x) sum += probs[router_row(r, s, t) * E + e];
  sum = block_sum(sum, sums);
  if (threadIdx.x != 0) return;
  chose[s * E + e] = static_cast<int32_t>(placed);
  terms[s * E + e] = static_cast<double>(router_aux_term(r, placed, sum));
  drops[s * E + e] = router_drops(r, placed);
}

// Under context parallelism, a block per (sequence, expert): this rank's
// assignments to the expert per (choice, chunk) into `counts`
// [router_context_cells], and its probabilities summed over this rank's
// rows (the group sums both).
__global__ void context_counts_kernel(RouterShape r, const float* probs, const int32_t* expert,
                                      double* counts, double* prob_sum) {
  __shared__ int ints[kWarp];
  __shared__ float sums[kWarp];
  const int64_t s = blockIdx.x, e = blockIdx.y, E = r.experts, K = r.top_k, n = r.seq_len / 2;
  for (int64_t j = 0; j < K; ++j)
    for (int64_t q = 0; q < 2; ++q) {
      int count = 0;
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x)
        count += expert[router_row(r, s, q * n + t) * K + j] == e ? 1 : 0;
      count = block_sum(count, ints);
      if (threadIdx.x == 0) counts[router_context_cell(r, s, j, q, e)] = count;
    }
  float sum = 0.f;
  for (int64_t t = threadIdx.x; t < r.seq_len; t += blockDim.x) sum += probs[router_row(r, s, t) * E + e];
  sum = block_sum(sum, sums);
  if (threadIdx.x == 0) prob_sum[s * E + e] = static_cast<double>(sum);
}

// Under context parallelism, a block per (sequence, expert), from every
// rank's counts `all`: where each of this rank's (choice, chunk) cells
// starts in the expert's capacity order (thread 0, into `next`), then
// this rank's assignments to the expert scanned in that order, each
// placed after the cells before its own. The places grow along this
// rank's order, so those within capacity are a prefix of its
// assignments: numbered in order (dest), the rest dropped. taken: the
// rows kept here; chose: the whole sequence's count; the aux term from
// the group's probability sums.
__global__ void context_capacity_kernel(RouterShape r, const int32_t* expert, const double* all,
                                        double* next, const double* prob_sum, int32_t* dest,
                                        int32_t* chose, int64_t* taken, double* terms,
                                        int64_t* drops) {
  __shared__ int counts[kWarp];
  __shared__ int64_t whole;
  const int64_t s = blockIdx.x, e = blockIdx.y, E = r.experts, K = r.top_k, n = r.seq_len / 2;
  if (threadIdx.x == 0) whole = router_context_places(r, s, e, all, next);
  __syncthreads();  // thread 0's places in `next` and `whole`, for every thread
  int64_t mine = 0, kept = 0;  // this rank's assignments to e so far, and those kept
  for (int64_t j = 0; j < K; ++j)
    for (int64_t q = 0; q < 2; ++q) {
      const int64_t first = static_cast<int64_t>(next[router_context_cell(r, s, j, q, e)]);
      int64_t placed = 0;
      for (int64_t t0 = 0; t0 < n; t0 += blockDim.x) {
        const int64_t t = t0 + threadIdx.x;
        const int64_t a = t < n ? router_row(r, s, q * n + t) * K + j : 0;
        const int flag = t < n && expert[a] == e ? 1 : 0;
        int total = 0;
        const int before = block_exclusive_count(flag, counts, &total);
        if (flag)
          dest[a] = router_dest(r, first + placed + before) < 0
                        ? -1
                        : static_cast<int32_t>(mine + placed + before);
        placed += total;
      }
      const int64_t room = r.capacity > 0 ? r.capacity - first : placed;
      kept += room < 0 ? 0 : room < placed ? room : placed;
      mine += placed;
    }
  if (threadIdx.x != 0) return;
  chose[s * E + e] = static_cast<int32_t>(whole);
  taken[s * E + e] = kept;
  drops[s * E + e] = mine - kept;
  terms[s * E + e] =
      static_cast<double>(router_aux_term(r, whole, static_cast<float>(prob_sum[s * E + e])));
}

// One block: the rows' starts (thread 0; E x S steps) and the call's
// totals, each summed in a fixed order: aux(s) = E x its experts' terms
// (under context parallelism, a sequence's aux added by context rank 0
// alone: the group sums it as one sequence's). taken: as router_rows's.
__global__ void rows_kernel(RouterShape r, const int32_t* chose, const int64_t* taken,
                            const float* lse, const double* terms, const int64_t* drops,
                            int64_t* start, int64_t* kept, double* totals) {
  __shared__ double shared[kWarp];
  if (threadIdx.x == 0) router_rows(r, chose, taken, start, kept);
  const int64_t S = r.tokens / r.seq_len, E = r.experts;
  double aux = 0, dropped = 0, z = 0;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
    float sum = 0.f;  // in float, as the host's router_sequence sums it
    for (int64_t e = 0; e < E; ++e) sum += static_cast<float>(terms[s * E + e]);
    aux += static_cast<double>(static_cast<float>(E) * sum);
    for (int64_t e = 0; e < E; ++e) dropped += static_cast<double>(drops[s * E + e]);
  }
  for (int64_t n = threadIdx.x; n < r.tokens; n += blockDim.x)
    z += static_cast<double>(lse[n]) * static_cast<double>(lse[n]);
  aux = block_sum(aux, shared);
  dropped = block_sum(dropped, shared);
  z = block_sum(z, shared);
  if (threadIdx.x == 0) {
    if (r.context_rank == 0) totals[kAuxSum] += aux;
    totals[kDropped] += dropped;
    totals[kZSum] += z;
  }
}

__global__ void dest_kernel(RouterShape r, const int32_t* expert, const int64_t* start,
                            int32_t* dest) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t s = router_sequence_of(r, n), E = r.experts, K = r.top_k;
  for (int64_t j = 0; j < K; ++j) {
    int32_t& d = dest[n * K + j];
    if (d >= 0) d = static_cast<int32_t>(start[s * E + expert[n * K + j]] + d);
  }
}

__global__ void router_backward_kernel(RouterShape r, float* dlogits, const float* dgate,
                                       const float* probs, const float* lse,
                                       const int32_t* expert, const float* gate,
                                       const int32_t* chose, float aux_scale, float z_scale) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t E = r.experts, K = r.top_k;
  router_token_backward(r, dlogits + n * E, dgate + n * K, probs + n * E, lse[n], expert + n * K,
                        gate + n * K, chose + router_sequence_of(r, n) * E, aux_scale, z_scale);
}

// The scratch (router_scratch_words): start, drops [S E] (int64), and
// the aux terms [S E] (double); under context parallelism also taken
// [S E] (int64), this rank's counts (then its places) [cells], every
// rank's [context, cells] and the probabilities' sums [S E] (double).
struct Scratch {
  int64_t* start;
  int64_t* drops;
  double* terms;
  int64_t* taken = nullptr;
  double* next = nullptr;
  double* all = nullptr;
  double* prob_sum = nullptr;
};
Scratch carve(const RouterShape& r, void* scratch) {
  const int64_t SE = router_sequences(r) * r.experts;
  auto* base = static_cast<int64_t*>(scratch);
  Scratch w{base, base + SE, reinterpret_cast<double*>(base + 2 * SE)};
  if (r.context > 1) {
    w.taken = base + 3 * SE;
    w.next = reinterpret_cast<double*>(base + 4 * SE);
    w.all = w.next + router_context_cells(r);
    w.prob_sum = w.all + r.context * router_context_cells(r);
  }
  return w;
}

}  // namespace

size_t router_scratch_bytes(const RouterShape& r) {
  return static_cast<size_t>(router_scratch_words(r)) * sizeof(int64_t);
}

void router_forward(const RouterShape& r, const float* logits, float* probs, float* lse,
                    int32_t* expert, float* gate, int32_t* dest, int32_t* chose, int64_t* kept,
                    double* totals, void* scratch, cudaStream_t stream,
                    const RouterExchange* exchange) {
  // Every rank of a context group calls: its exchange is collective.
  MPIFORMER_CHECK(r.context == 1 || exchange != nullptr,
                  "router: context parallel without the group's exchange");
  MPIFORMER_CHECK(r.experts <= 65535, "router: experts above 65535 (the capacity grid's y)");
  // (Before anything divides by the shape: no tokens, no sequences. The
  // context group's ranks hold equal chunks, so all return together.)
  if (r.tokens == 0) return;
  const Scratch w = carve(r, scratch);
  const int64_t S = router_sequences(r);
  softmax_topk_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(r, logits, probs, lse, expert,
                                                                     gate);
  CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(S), static_cast<unsigned>(r.experts));
  if (r.context == 1) {
    capacity_kernel<<<grid, 256, 0, stream>>>(r, probs, expert, dest, chose, w.terms, w.drops);
    CUDA_CHECK_LAUNCH();
  } else {
    context_counts_kernel<<<grid, 256, 0, stream>>>(r, probs, expert, w.next, w.prob_sum);
    CUDA_CHECK_LAUNCH();
    // The group's communicator orders both on this stream.
    exchange->gather(w.next, w.all, router_context_cells(r));
    exchange->sum(w.prob_sum, S * r.experts);
    context_capacity_kernel<<<grid, 256, 0, stream>>>(r, expert, w.all, w.next, w.prob_sum, dest,
                                                      chose, w.taken, w.terms, w.drops);
    CUDA_CHECK_LAUNCH();
  }
  rows_kernel<<<1, 256, 0, stream>>>(r, chose, w.taken, lse, w.terms, w.drops, w.start, kept,
                                     totals);
  CUDA_CHECK_LAUNCH();
  dest_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(r, expert, w.start, dest);
  CUDA_CHECK_LAUNCH();
}

void router_backward(const RouterShape& r, float* dlogits, const float* dgate, const float* probs,
                     const float* lse, const int32_t* expert, const float* gate,
                     const int32_t* chose, float aux_scale, float z_scale, cudaStream_t stream) {
  if (r.tokens == 0) return;
  router_backward_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(
      r, dlogits, dgate, probs, lse, expert, gate, chose, aux_scale, z_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mpiformer::cuda
