#include "cuda/context.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <cstring>

#include "core/cuda_check.hpp"

namespace mpiformer::cuda {

Context::Context(int device) : device_(device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  blas_ = std::make_unique<Blas>(stream_);
  reduce_ = DeviceBuffer<double>(kReduceBlocks + 1);
  scalar_ = PinnedBuffer<double>(1);
}

Context::~Context() {
  // Buffers are freed by their owners; the stream goes last, once idle.
  // While unwinding, the stream may wait on a communication that will never
  // complete: do not wait (errors are ignored for the same reason).
  if (std::uncaught_exceptions() == 0) cudaStreamSynchronize(stream_);
  offload_copies_.reset();
  blas_.reset();
  cudaStreamDestroy(stream_);
}

namespace {

// Polls `query` (a stream's or an event's) until it is done, calling the
// wait check between polls, so a failure elsewhere (a communicator's peer
// gone) surfaces as an exception instead of a hang.
template <class Query>
void poll(Query query, const std::function<void()>& check) {
  for (;;) {
    const cudaError_t st = query();
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) CUDA_CHECK(st);
    check();
    // A step's waits are milliseconds long; 20 us between polls costs
    // nothing measurable and keeps one host core from spinning flat out.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

void Context::synchronize() {
  if (!wait_check_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  poll([this] { return cudaStreamQuery(stream_); }, wait_check_);
}

void Context::wait_for(cudaEvent_t event) {
  if (!wait_check_) {
    CUDA_CHECK(cudaEventSynchronize(event));
    return;
  }
  poll([event] { return cudaEventQuery(event); }, wait_check_);
}

OffloadCopies& Context::offload_copies() {
  if (!offload_copies_) offload_copies_ = std::make_unique<OffloadCopies>(*this);
  return *offload_copies_;
}

std::string Context::device_name() const {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  return prop.name;
}

double Context::read(const double* device_value) {
  CUDA_CHECK(cudaMemcpyAsync(scalar_.get(), device_value, sizeof(double), cudaMemcpyDeviceToHost,
                             stream_));
  synchronize();
  return *scalar_.get();
}

Tokens::Tokens(int64_t n)
    : n_(n),
      device_(static_cast<size_t>(4 * n + 1)),
      staging_(static_cast<size_t>(4 * n + 1)) {
  CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

Tokens::~Tokens() {
  if (uploaded_ != nullptr) cudaEventDestroy(uploaded_);
}

Tokens::Tokens(Tokens&& o) noexcept
    : n_(o.n_),
      groups_(o.groups_),
      device_(std::move(o.device_)),
      staging_(std::move(o.staging_)),
      uploaded_(std::exchange(o.uploaded_, nullptr)) {}

Tokens& Tokens::operator=(Tokens&& o) noexcept {
  if (this != &o) {
    if (uploaded_ != nullptr) cudaEventDestroy(uploaded_);
    n_ = o.n_;
    groups_ = o.groups_;
    device_ = std::move(o.device_);
    staging_ = std::move(o.staging_);
    uploaded_ = std::exchange(o.uploaded_, nullptr);
  }
  return *this;
}

void Tokens::load(Context& ctx, const int32_t* src, int64_t n, bool grouped) {
  // The previous upload from the staging buffer must have left it; it was
  // queued a micro-batch ago, so this rarely waits.
  CUDA_CHECK(cudaEventSynchronize(uploaded_));
  int32_t* h = staging_.get();
  std::memcpy(h, src, sizeof(int32_t) * static_cast<size_t>(n));
  size_t count = static_cast<size_t>(n);
  if (grouped) {
    // The grouping (a sort) runs here on the host, while the GPU is still
    // busy with earlier work.
    TokenGroups& g = ctx.token_groups();
    g.build(src, n);
    groups_ = static_cast<int64_t>(g.tokens.size());
    std::copy(g.tokens.begin(), g.tokens.end(), h + n);
    std::copy(g.starts.begin(), g.starts.end(), h + 2 * n);
    std::copy(g.positions.begin(), g.positions.end(), h + 3 * n + 1);
    count = static_cast<size_t>(4 * n + 1);
  }
  CUDA_CHECK(cudaMemcpyAsync(device_.get(), h, sizeof(int32_t) * count, cudaMemcpyHostToDevice,
                             ctx.stream()));
  CUDA_CHECK(cudaEventRecord(uploaded_, ctx.stream()));
}

DeviceTokenGroups Tokens::groups() const {
  int32_t* d = device_.get();
  return DeviceTokenGroups{d + n_, d + 2 * n_, d + 3 * n_ + 1, groups_};
}

}  // namespace mpiformer::cuda
