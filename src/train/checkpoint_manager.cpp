#include "train/checkpoint_manager.hpp"

#include "offload_files.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <cerrno>
#include <chrono>
#include <exception>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "checkpoint.hpp"
#include "core/test_hooks.hpp"
#include "checkpoint_store.hpp"
#include "core/error.hpp"
#include "host/parallel.hpp"
#include "core/format.hpp"
#include "parallel/input_agreement.hpp"
#include "core/mpi_check.hpp"
#include "train/checkpointing.hpp"

namespace mpiformer {

namespace {

// No NaN or infinity among n floats: the exponent's bits all set, counted
// without a branch so the loop runs in vector registers (a save waits for
// it).
bool finite_floats(const float* x, int64_t n) {
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    nonfinite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return nonfinite == 0;
}

// What a save refuses a slice for: 2 the weights (said first), 1 the
// moments.
int nonfinite_kind(const DatasetSlice& d) { return d.name.rfind("/model/", 0) == 0 ? 2 : 1; }

// A piece of a background save's snapshot: copied out of the live state
// and scanned for NaN while it is in cache.
struct SnapshotPiece {
  float* to;
  const float* from;
  int64_t n;
  int kind;  // nonfinite_kind of its slice: 0 for the residuals, not scanned
};
// A piece copied: the nonfinite_kind it met (0: finite, or not scanned).
int copy_piece(const SnapshotPiece& p) {
  std::memcpy(p.to, p.from, sizeof(float) * static_cast<size_t>(p.n));
  return p.kind > 0 && !finite_floats(p.to, p.n) ? p.kind : 0;
}

}  // namespace

// A save whose tensors a thread writes while training goes on: the
// snapshot it writes from (owned: training changes the live state), the
// file's layout, and what the thread found. A deferred snapshot is
// copied by the thread too, beside the next step's forward and backward
// (which read the state and change none of it): `copied` says when, and
// the step's update waits for it (settle_snapshot).
struct CheckpointManager::Background {
  bool read_back_only = false;  // kReadBackBehind: written already, read back by the thread
  std::vector<std::vector<float>> snapshot;
  std::vector<DatasetSlice> slices;
  CheckpointLayout layout;
  double need = 0, free = 0;  // for the no-space message
  std::thread writer;
  std::atomic<bool> done{false};
  BlockWrite result;
  // The slices from first_copied on are copied into `snapshot` (the
  // ones before, a GPU's downloaded state, are written from where they
  // are); those before state_slices are scanned (the rest: residuals).
  size_t first_copied = 0, state_slices = 0;
  std::vector<SnapshotPiece> pieces;
  // The snapshot's buffers sized, the copy's pieces listed, and the
  // slices pointed at the buffers. The last save's buffers are reused:
  // memory already touched copies at memory's rate; fresh pages fault in
  // one by one.
  void take_pieces() {
    snapshot.resize(slices.size());
    constexpr int64_t kPiece = int64_t{1} << 20;
    for (size_t i = first_copied; i < slices.size(); ++i) {
      DatasetSlice& d = slices[i];
      const int64_t count = slice_elements(d);
      snapshot[i].resize(static_cast<size_t>(count));
      const int kind = i < state_slices ? nonfinite_kind(d) : 0;
      for (int64_t at = 0; at < count; at += kPiece)
        pieces.push_back({snapshot[i].data() + at, d.data + at, std::min(kPiece, count - at), kind});
      d.data = snapshot[i].data();
      d.written = nullptr;
    }
  }
  // Deferred: the copy is the thread's; what it found (under `mutex`).
  bool deferred = false, settled = false;
  std::vector<float> residual;
  std::mutex mutex;
  std::condition_variable copied_cv;
  bool copied = false;
  int bad = 0;
  double copy_seconds = 0;
};

CheckpointManager::CheckpointManager(const Deck& deck, const GptConfig& cfg, ProcessGrid& grid,
                                     StageBackend& stage, std::string tokenizer)
    : deck_(deck), cfg_(cfg), grid_(grid), stage_(stage), tokenizer_(std::move(tokenizer)) {}

CheckpointManager::~CheckpointManager() {
  // A run that ends by an error with a write in flight: its file stays a
  // .tmp (never published, never resumed from); the thread is waited for.
  if (background_ && background_->writer.joinable()) background_->writer.join();
}

namespace {

// Rank 0 decides what to try (file systems may disagree between nodes):
// `latest` first, then every complete checkpoint, newest first.
std::vector<std::string> candidates(const CheckpointConfig& cc, int rank) {
  std::string list;
  if (rank == 0) {
    if (cc.resume == ResumeMode::kPath) {
      list = cc.resume_path;
    } else {
      const CheckpointStore store(cc.dir);
      std::vector<std::string> names;
      try {
        if (const std::string l = store.latest(); !l.empty()) names.push_back(l);
      } catch (const InputError& e) {
        std::fprintf(stderr, "mpiformer: warning: %s; trying the complete checkpoints, newest "
                     "first\n", e.what());
      }
      for (const auto& p : store.complete())
        if (std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
      for (const auto& n : names) list += n + "\n";
    }
  }
  broadcast_string(MPI_COMM_WORLD, list, 0);
  std::vector<std::string> out;
  for (size_t a = 0, b; a < list.size(); a = b + 1) {
    b = list.find('\n', a);
    if (b == std::string::npos) b = list.size();
    if (b > a) out.push_back(list.substr(a, b - a));
  }
  return out;
}

}  // namespace

ResumePoint CheckpointManager::resume() {
  ResumePoint start = load();
  if (!start.resumed) {
    start.run_id = grid_.world_rank() == 0 ? new_run_id() : "";
    broadcast_string(MPI_COMM_WORLD, start.run_id, 0);
  }
  run_id_ = start.run_id;
  std::string failure;
  if (grid_.world_rank() == 0) {
    try {
      // This job holds the directory's lock: no save of another is running.
      if (const int n = CheckpointStore(deck_.checkpoint.dir).remove_unfinished(); n > 0) {
        std::printf("checkpoint: removed %d unfinished save(s) (.tmp) an earlier job left\n", n);
      }
      set_aside_others(start);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  broadcast_string(MPI_COMM_WORLD, failure, 0);
  if (!failure.empty()) {
    throw InputError(deck_.checkpoint.dir, "[checkpoint] dir",
                     "cannot move another run's checkpoints aside: " + failure);
  }
  return start;
}

void CheckpointManager::set_aside_others(const ResumePoint& start) const {
  const CheckpointStore store(deck_.checkpoint.dir);
  std::vector<std::string> others;
  std::string why;
  for (const auto& path : store.complete()) {
    std::string id = "(unreadable)";
    if (CheckpointStore::step_of(path) <= start.step) {
      try {
        id = CheckpointReader(path).meta().run_id;
      } catch (const InputError&) {
      }
    }
    if (id != start.run_id) {
      others.push_back(path);
      if (why.empty()) {
        why = strprintf("%s (step %lld, run %s)", path.c_str(),
                        static_cast<long long>(CheckpointStore::step_of(path)),
                        id.empty() ? "without id" : id.c_str());
      }
    }
  }
  if (others.empty()) return;
  const std::string aside = store.set_aside(others);
  std::printf("checkpoint: moved %zu checkpoint(s) this run did not write, or past its start "
              "(step %lld), out of the way into %s, e.g. %s\n",
              others.size(), static_cast<long long>(start.step), aside.c_str(), why.c_str());
  std::fflush(stdout);
}

ResumePoint CheckpointManager::load() {
  const CheckpointConfig& cc = deck_.checkpoint;
  ResumePoint start;
  if (cc.resume == ResumeMode::kNever) return start;
  const bool automatic = cc.resume == ResumeMode::kAuto;
  const int rank = grid_.world_rank();
  const std::vector<std::string> paths = candidates(cc, rank);
  // Each rank reads only its rows of a plan cut over its data-parallel
  // group: its ZeRO shard, or under zero 0 a plan made for the read, after
  // which the group gathers the whole stage. Each byte of the file is read
  // once per group, not once per replica (an expert's once per the
  // replicas holding it).
  const ShardPlan* plan = stage_.shard_plan();
  const int64_t n = stage_.state_size();
  const ReadGroups groups = read_groups(grid_);
  std::string last_error;
  for (const auto& path : paths) {
    const auto t0 = std::chrono::steady_clock::now();
    // Offloaded state is read into its own place (a view of its files):
    // a failed read leaves it half-written, but every successful restore
    // writes every element, and a run that none succeeds for ends.
    float* in_place[3] = {stage_.state_in_place(0), stage_.state_in_place(1),
                          stage_.state_in_place(2)};
    std::vector<float> m(in_place[0] ? 0 : n), v(in_place[1] ? 0 : n), params(in_place[2] ? 0 : n);
    StageState scratch{in_place[2] ? in_place[2] : params.data(),
                       in_place[0] ? in_place[0] : m.data(),
                       in_place[1] ? in_place[1] : v.data(), plan};
    // Views of files keep a tensor's pages at a time.
    if (stage_.offload_files() != nullptr)
      scratch.done_with = [this](const float* p, int64_t k) { stage_.drop_state_pages(p, k); };
    CheckpointMeta meta;
    double bytes_read = 0;
    const bool compressed = deck_.train.grad_compression != GradCompression::kNone;
    std::vector<float> residual;
    bool residual_read = false;
    try {
      // Never half-loaded: every rank opens the file, all agree; then each
      // reads its rows into scratch (collective over its group, errors
      // agreed there); all agree; then commit.
      std::unique_ptr<CheckpointReader> reader;
      agree_on_input_errors(MPI_COMM_WORLD, [&] {
        reader = std::make_unique<CheckpointReader>(path);
        meta = reader->meta();
      });
      agree_on_input_errors(MPI_COMM_WORLD, [&] {
        bytes_read = static_cast<double>(
            plan != nullptr
                ? restore_shard(*reader, cfg_, stage_.table(), scratch, groups)
                : restore_whole_stage(*reader, cfg_, stage_.table(), stage_.range(), scratch,
                                      groups));
      });
      if (compressed) {
        residual = stage_.compression_state();  // sized as this run holds them
        agree_on_input_errors(MPI_COMM_WORLD, [&] {
          residual_read = restore_compression(*reader, grid_.dp(), grid_.pp(), grid_.tp(),
                                              MPI_COMM_WORLD, residual);
        });
      }
    } catch (const InputError& e) {
      if (!automatic) throw;
      last_error = e.what();
      if (rank == 0) {
        std::fprintf(stderr, "mpiformer: warning: cannot resume from %s: %s; trying an older one\n",
                     path.c_str(), e.what());
      }
      continue;
    }
    stage_.load_state(scratch.params, scratch.adam_m, scratch.adam_v);
    if (compressed && residual_read) {
      stage_.load_compression_state(residual);
    } else if (compressed) {
      stage_.forget_compression_state();
      if (rank == 0)
        std::printf("resume: [train] grad_compression's residuals start at zero (the checkpoint "
                    "was written by another layout, or without them)\n");
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bytes_read, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    start.step = meta.step;
    start.cursor = meta.sample_position;
    start.resumed = true;
    start.run_id = meta.run_id;
    start.path = path;
    start.data_blend = meta.data_blend;
    start.has_scaler = meta.loss_scaler == 1;
    start.scaler = {std::ldexp(1.0, static_cast<int>(meta.loss_scale_log2)),
                    meta.loss_scale_good_steps};
    if (rank == 0) {
      std::printf("resumed from %s: step %lld, %lld samples seen (epoch %lld), written by "
                  "dp %lld x pp %lld x tp %lld%s on %lld rank(s); now dp %d x pp %d x tp %d%s, "
                  "zero %lld\n",
                  path.c_str(), static_cast<long long>(meta.step),
                  static_cast<long long>(meta.sample_position), static_cast<long long>(meta.epoch),
                  static_cast<long long>(meta.dp), static_cast<long long>(meta.pp),
                  static_cast<long long>(meta.tp),
                  meta.cp > 1 ? strprintf(" x cp %lld", static_cast<long long>(meta.cp)).c_str() : "",
                  static_cast<long long>(meta.world_size), grid_.dp() / grid_.cp(), grid_.pp(),
                  grid_.tp(), grid_.cp() > 1 ? strprintf(" x cp %d", grid_.cp()).c_str() : "",
                  static_cast<long long>(deck_.parallel.zero));
      std::printf("checkpoint: read %.1f MB of tensors from the file over all ranks (each byte "
                  "once per data-parallel group) in %.2f s\n",
                  bytes_read / 1e6, dt);
      // A Mixture of Experts' training choices may change on resume (the
      // tensors and what they compute do not): said, so the change is seen.
      const GptConfig saved = model_config(meta);
      for (const auto& [key, was, now] :
           {std::tuple{"capacity_factor", saved.capacity_factor, cfg_.capacity_factor},
            std::tuple{"aux_loss", saved.aux_loss, cfg_.aux_loss},
            std::tuple{"router_z_loss", saved.router_z_loss, cfg_.router_z_loss}}) {
        if (cfg_.moe() && was != now)
          std::printf("resume: [model] %s changes from %g (the checkpoint's run) to %g, as the "
                      "deck says; the training goes on with %g\n",
                      key, was, now, now);
      }
      std::fflush(stdout);
    }
    return start;
  }
  if (!paths.empty()) {
    throw InputError(cc.dir, "[checkpoint] resume",
                     "no checkpoint here could be loaded (last error: " + last_error +
                         "); set [checkpoint] resume = \"never\" to start afresh");
  }
  return start;
}

int CheckpointManager::nonfinite_state(const std::vector<DatasetSlice>& slices,
                                       const StageState& state) const {
  // A checkpoint is what a run falls back on: one holding NaN or infinity
  // (weights from a damaged init, a hardware fault) must never be published
  // as `latest`. Every rank judges what it writes (together: the whole
  // file; replicas holding the same tensors share the scan).
  // In pieces: offloaded state's views drop each one's pages after it, one
  // piece at a time; state in memory is scanned by the rank's threads.
  constexpr int64_t kPiece = int64_t{1} << 22;
  const auto finite = [&](const float* x, int64_t n) {
    if (x == nullptr) return true;
    const int64_t pieces = (n + kPiece - 1) / kPiece;
    if (!state.done_with) {
      std::vector<uint8_t> ok(static_cast<size_t>(pieces));
      uint8_t* o = ok.data();
      host::parallel_for("checkpoint_finite_scan", pieces, [=](const int64_t p) {
        o[p] = finite_floats(x + p * kPiece, std::min(kPiece, n - p * kPiece)) ? 1 : 0;
      });
      return std::find(ok.begin(), ok.end(), 0) == ok.end();
    }
    for (int64_t at = 0; at < n; at += kPiece) {
      const int64_t len = std::min(kPiece, n - at);
      const bool ok = finite_floats(x + at, len);
      state.done_with(x + at, len);
      if (!ok) return false;
    }
    return true;
  };
  int bad = 0;
  for (const DatasetSlice& d : slices)
    if (!finite(d.data, slice_elements(d))) bad = std::max(bad, nonfinite_kind(d));
  return bad;
}

void CheckpointManager::refuse_nonfinite(int bad, int64_t step) {
  const int worst = agreed_nonfinite(bad);
  if (worst != 0) throw nonfinite_refusal(worst, step);
}

int CheckpointManager::agreed_nonfinite(int bad) {
  int worst = bad;
  MPI_CHECK(MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return worst;
}

AgreedInputError CheckpointManager::nonfinite_refusal(int worst, int64_t step) const {
  std::string store_latest;
  try {
    store_latest = CheckpointStore(deck_.checkpoint.dir).latest();
  } catch (const InputError& e) {
    store_latest = e.what();
  }
  return AgreedInputError(
      deck_.checkpoint.dir, "[checkpoint]",
      strprintf("the %s of step %lld hold NaN or infinity: this checkpoint is not written, and "
                "`latest` still names %s",
                worst == 2 ? "weights" : "AdamW moments", static_cast<long long>(step),
                store_latest.empty() ? "no checkpoint" : store_latest.c_str()));
}

AgreedInputError CheckpointManager::no_space(int64_t step, double need, double free,
                                             const std::string& what) const {
  return AgreedInputError(
      deck_.checkpoint.dir, "[checkpoint] dir",
      strprintf("no space left on its file system: the checkpoint of step %lld needs %.2f MB "
                "(and HDF5's metadata), %.2f MB were free; %s. The checkpoints already there "
                "are intact: free space "
                "(or set [checkpoint] dir elsewhere) and run again to resume",
                static_cast<long long>(step), need / 1e6, free / 1e6, what.c_str()));
}

AgreedInputError CheckpointManager::write_refused(const CheckpointWriteError& e, int64_t step,
                                                  double need, double free) const {
  // Every rank is here with the same message: stop together. (errno does
  // not always survive MPI-IO and HDF5, hence the second test.)
  const std::string why = e.what();
  if (why.find(std::strerror(ENOSPC)) != std::string::npos || (free >= 0 && free < 1.5 * need))
    return no_space(step, need, free, why);
  return AgreedInputError(deck_.checkpoint.dir, "[checkpoint] dir",
                          "the checkpoint could not be written: " + why +
                              ". The checkpoints already there are intact");
}

double CheckpointManager::checkpoint_mb() const {
  const ParameterTable whole(cfg_, StageRange{0, cfg_.n_layer, true, true});
  return 3.0 * 4.0 * static_cast<double>(whole.total_numel()) / 1e6;
}

void CheckpointManager::publish(const std::string& path) {
  if (grid_.world_rank() == 0) {
    const CheckpointStore store(deck_.checkpoint.dir);
    store.publish_latest(path, run_id_);
    store.prune(deck_.checkpoint.keep);
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

double CheckpointManager::settle_snapshot() {
  if (!background_ || !background_->deferred || background_->settled) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  Background& b = *background_;
  {
    std::unique_lock<std::mutex> lock(b.mutex);
    b.copied_cv.wait(lock, [&b] { return b.copied; });
  }
  b.settled = true;
  b.pieces.clear();  // they point into the live state
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t step = b.layout.step;
  const int worst = agreed_nonfinite(b.bad);
  if (worst != 0) {
    // No rank publishes it: the threads' writes end (a rank whose copy
    // found NaN wrote nothing) and the partial file goes.
    b.writer.join();
    if (grid_.world_rank() == 0) std::remove(b.layout.tmp.c_str());
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    background_.reset();
    throw nonfinite_refusal(worst, step);
  }
  if (grid_.world_rank() == 0) {
    std::printf("checkpoint: step %lld's snapshot copied and scanned beside the next step in "
                "%.2f s; the update waited %.2f s for it\n",
                static_cast<long long>(step), b.copy_seconds, waited);
    std::fflush(stdout);
  }
  return waited;
}

double CheckpointManager::finish_background(bool wait) {
  if (!background_) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  settle_snapshot();
  Background& b = *background_;
  if (!wait) {
    int done = b.done.load(std::memory_order_acquire) ? 1 : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (done == 0) return 0;
  }
  b.writer.join();
  const std::unique_ptr<Background> finished = std::move(background_);
  try {
    finish_checkpoint(MPI_COMM_WORLD, b.layout, b.result);
  } catch (const CheckpointWriteError& e) {
    throw write_refused(e, b.layout.step, b.need, b.free);
  }
  publish(b.layout.path);
  if (!b.read_back_only) spare_snapshot_ = std::move(b.snapshot);
  last_read_back_ = b.result.verify_seconds;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (grid_.world_rank() == 0) {
    const double mb = checkpoint_mb();
    if (b.read_back_only) {
      std::printf("checkpoint: read back and verified %s beside training (%.1f MB; rank 0's part in "
                  "%.2f s); published\n",
                  b.layout.path.c_str(), mb, b.result.verify_seconds);
    } else {
      std::printf("checkpoint: wrote %s in the background (%.1f MB; rank 0 wrote, flushed and read "
                  "back its part in %.2f s beside training)\n",
                  b.layout.path.c_str(), mb, b.result.seconds);
    }
    std::fflush(stdout);
  }
  return dt;
}

double CheckpointManager::save(int64_t step, const DataPosition& data, const LossScaler& scaler,
                               Mode mode) {
  const bool background = mode == Mode::kBackground;
  if (background_) throw std::logic_error("a save while a background write is in flight");
  const auto t0 = std::chrono::steady_clock::now();
  const CheckpointStore store(deck_.checkpoint.dir);
  store.create_dir();
  CheckpointMeta meta;
  meta.step = step;
  meta.sample_position = data.cursor;
  meta.tokens_seen = data.cursor * cfg_.seq_len;
  meta.epoch = data.epoch;
  meta.data_blend = data.blend;
  meta.seed = deck_.train.seed;
  meta.dp = grid_.dp() / grid_.cp();
  meta.cp = grid_.cp();
  meta.pp = grid_.pp();
  meta.tp = grid_.tp();
  meta.world_size = grid_.dp() * grid_.pp() * grid_.tp();
  if (scaler.dynamic()) {
    meta.loss_scaler = 1;
    meta.loss_scale_log2 = std::ilogb(scaler.state().scale);
    meta.loss_scale_good_steps = scaler.state().good_steps;
  }
  set_model_config(meta, cfg_);
  meta.tokenizer = tokenizer_;
  meta.deck = deck_.to_toml();
  meta.run_id = run_id_;
  const std::string path = store.path_for_step(step);
  // The tensors' bytes alone (HDF5 adds a little): a file system with less
  // free cannot hold it, and nothing is started. Old checkpoints are pruned
  // only after a newer one is complete, so they cannot make room first.
  const ParameterTable whole(cfg_, StageRange{0, cfg_.n_layer, true, true});
  const double need = 3.0 * 4.0 * static_cast<double>(whole.total_numel());
  double free = grid_.world_rank() == 0 ? static_cast<double>(store.free_bytes()) : 0;
  MPI_CHECK(MPI_Bcast(&free, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  if (free >= 0 && free < need) throw no_space(step, need, free, "nothing was written");
  // The offloaded optimizer files as this run made them? A file cut under
  // the run has lost the state: nothing is written (a checkpoint of it
  // would be wrong) and the run stops to restart from the last one. A
  // name removed or replaced leaves the state intact behind the run's own
  // descriptors, which the save reads: it is written, and the run stops
  // after (below).
  const OffloadFiles* offload = stage_.offload_files();
  const auto tamper = test_hooks::fault_offload_tamper();
  const bool tampering = offload != nullptr && grid_.world_rank() == 0 && tamper.step == step;
  if (tampering && tamper.action != "cut-in-save") offload->tamper(tamper.action);
  const OffloadFiles::Integrity integrity =
      offload != nullptr ? offload->integrity() : OffloadFiles::Integrity{};
  const std::string cut = lowest_rank_message(
      MPI_COMM_WORLD, integrity.kind == OffloadFiles::Integrity::kCut ? integrity.what : "");
  if (!cut.empty()) {
    throw RestartableError(cut + strprintf("; the checkpoint of step %lld was not written",
                                           static_cast<long long>(step)));
  }
  const std::string gone = lowest_rank_message(
      MPI_COMM_WORLD, integrity.kind == OffloadFiles::Integrity::kGone ? integrity.what : "");
  const auto before_state = std::chrono::steady_clock::now();
  const StageState state = stage_.host_state();
  const auto got_state = std::chrono::steady_clock::now();
  if (tampering && tamper.action == "cut-in-save") offload->tamper("cut");
  if (step == test_hooks::fault_nonfinite_weights_save() && grid_.world_rank() == 0 &&
      !stage_.on_device()) {
    state.params[0] = std::numeric_limits<float>::quiet_NaN();
  }
  // Offloaded moments are read through views of their files: dropped
  // from memory again however the save ends.
  struct Release {
    StageBackend& stage;
    ~Release() noexcept(false) {
      if (std::uncaught_exceptions() == 0) {
        stage.release_host_state();
        return;
      }
      try {
        stage.release_host_state();
      } catch (...) {  // the error already on its way says more
      }
    }
  } release{stage_};
  auto slices = checkpoint_slices(cfg_, stage_.table(), state, grid_);
  const auto summed = std::chrono::steady_clock::now();
  // The slices of a detached state (a GPU's, downloaded) are written from
  // where they are; the rest are copied.
  const size_t detached = state.detached ? slices.size() : 0;
  const size_t state_slices = slices.size();
  // A snapshot's copy scans what it copies, from cache (below); any other
  // save scans here.
  const bool scan_in_copy = background && detached == 0;
  if (!scan_in_copy) refuse_nonfinite(nonfinite_state(slices, state), step);
  const auto scanned = std::chrono::steady_clock::now();
  // Error feedback's residuals, so a resume on this layout goes on exactly.
  std::vector<float> residual = stage_.compression_state();
  for (DatasetSlice& d : compression_slices(residual, MPI_COMM_WORLD)) slices.push_back(std::move(d));
  if (background) {
    // The snapshot: what this rank writes, copied out of the live state
    // (the next step's update changes it); then the file laid out,
    // collectively, and a thread writes the bytes. Where the state is
    // the stage's own memory, the thread copies it too, beside the next
    // step's forward and backward, and that step's update waits for the
    // copy (settle_snapshot): the save stops training for its checksums
    // and layout alone. Not where moments are read through views of the
    // offload files (released when the save returns).
    auto bg = std::make_unique<Background>();
    bg->need = need;
    bg->free = free;
    bg->deferred = scan_in_copy && offload == nullptr;
    bg->snapshot = std::move(spare_snapshot_);
    bg->residual = std::move(residual);  // the residuals' slice points into it
    bg->slices = std::move(slices);
    bg->first_copied = detached;
    bg->state_slices = state_slices;
    if (!bg->deferred) {
      // Copied here, in pieces by the rank's threads.
      bg->take_pieces();
      const SnapshotPiece* p = bg->pieces.data();
      std::vector<int> piece_bad(bg->pieces.size(), 0);
      int* pb = piece_bad.data();
      host::parallel_for("checkpoint_snapshot", static_cast<int64_t>(piece_bad.size()),
                         [=](int64_t i) { pb[i] = copy_piece(p[i]); });
      bg->pieces.clear();
      if (scan_in_copy)
        refuse_nonfinite(piece_bad.empty() ? 0 : *std::max_element(piece_bad.begin(), piece_bad.end()),
                         step);
    }
    const auto laid = std::chrono::steady_clock::now();
    try {
      bg->layout = lay_out_checkpoint(MPI_COMM_WORLD, path, meta, bg->slices);
    } catch (const CheckpointWriteError& e) {
      throw write_refused(e, step, need, free);
    }
    Background* b = bg.get();
    b->writer = std::thread([b] {
      if (b->deferred) {
        // One thread, beside training's: the copy (and a first save's
        // buffers) has a step to finish in.
        const auto c0 = std::chrono::steady_clock::now();
        b->take_pieces();
        int bad = 0;
        for (const SnapshotPiece& piece : b->pieces) bad = std::max(bad, copy_piece(piece));
        {
          const std::lock_guard<std::mutex> lock(b->mutex);
          b->bad = bad;
          b->copied = true;
          b->copy_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        }
        b->copied_cv.notify_all();
        // Nothing of a state that is not finite is written: the update's
        // agreement refuses the checkpoint on every rank.
        if (bad != 0) {
          b->result.failure = "its state holds NaN or infinity";
          b->done.store(true, std::memory_order_release);
          return;
        }
      }
      b->result = write_blocks(b->layout, b->slices);
      b->done.store(true, std::memory_order_release);
    });
    background_ = std::move(bg);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (grid_.world_rank() == 0) {
      const auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
      // (The scan is the copy's where it copies, else its own.)
      const std::string copy =
          b->deferred ? std::string("snapshot and finite scan beside the next step")
          : scan_in_copy ? strprintf("snapshot and finite scan %.2f s", s(scanned, laid))
                         : strprintf("finite scan %.2f s, snapshot %.2f s", s(summed, scanned),
                                     s(scanned, laid));
      std::printf("checkpoint: step %lld taken in %.2f s (state %.2f s, checksums %.2f s, %s, "
                  "the file's layout %.2f s); %s is written in the background\n",
                  static_cast<long long>(step), dt, s(before_state, got_state), s(got_state, summed),
                  copy.c_str(), s(laid, std::chrono::steady_clock::now()), path.c_str());
      std::fflush(stdout);
    }
    return dt;
  }
  // Read back beside training: the bytes written and flushed here, the
  // file laid out first (collective) as a background save's is; a thread
  // reads them back against the hashes taken as they went, and
  // finish_background publishes. Not when the offloaded files went away
  // (below: the run stops once this checkpoint is published).
  if (mode == Mode::kReadBackBehind && gone.empty()) {
    auto bg = std::make_unique<Background>();
    bg->read_back_only = true;
    bg->need = need;
    bg->free = free;
    try {
      bg->layout = lay_out_checkpoint(MPI_COMM_WORLD, path, meta, slices);
    } catch (const CheckpointWriteError& e) {
      throw write_refused(e, step, need, free);
    }
    bg->result = write_blocks(bg->layout, slices, false);
    // The thread reads the blocks' places, never the data (the live state).
    for (DatasetSlice& d : slices) {
      d.data = nullptr;
      d.written = nullptr;
    }
    bg->slices = std::move(slices);
    Background* b = bg.get();
    b->writer = std::thread([b] {
      read_back_blocks(b->layout, b->slices, b->result);
      b->done.store(true, std::memory_order_release);
    });
    background_ = std::move(bg);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (grid_.world_rank() == 0) {
      const double mb = checkpoint_mb();
      std::printf("checkpoint: wrote %s (%.1f MB in %.2f s, %.0f MB/s; rank 0 wrote and flushed its "
                  "part in %.2f s); read back beside training, published once it matches\n",
                  path.c_str(), mb, dt, mb / dt, background_->result.seconds);
      std::fflush(stdout);
    }
    return dt;
  }
  double verify_seconds = 0;
  try {
    verify_seconds = write_checkpoint(MPI_COMM_WORLD, path, meta, slices);
  } catch (const CheckpointWriteError& e) {
    throw write_refused(e, step, need, free);
  }
  publish(path);
  last_read_back_ = verify_seconds;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (grid_.world_rank() == 0) {
    const double mb = checkpoint_mb();
    std::printf("checkpoint: wrote %s (%.1f MB in %.2f s, %.0f MB/s; read back and verified "
                "in %.2f s of that)\n",
                path.c_str(), mb, dt, mb / dt, verify_seconds);
    std::fflush(stdout);
  }
  if (!gone.empty()) {
    const std::string done =
        strprintf("; the checkpoint of step %lld, taken from the run's own open files and "
                  "verified, is published",
                  static_cast<long long>(step));
    if (step < deck_.train.steps) {
      // The directory is no longer this run's alone: a restart makes its
      // files and its lock afresh.
      throw RestartableError(gone + done + ", and a restart resumes from it with fresh files");
    }
    if (grid_.world_rank() == 0)
      std::fprintf(stderr, "mpiformer: warning: %s%s; the run is complete\n", gone.c_str(),
                   done.c_str());
  }
  return dt;
}

void CheckpointManager::check_tensor_replicas() {
  if (grid_.tp() == 1) return;
  // The tensors a tensor group replicates get identical updates from
  // identical gradients: their bits must agree on every rank of it. Each
  // rank hashes its copy (under ZeRO, the rows it owns, cut alike on every
  // tensor rank); the group compares the hashes. Likewise the rows of kv
  // heads shared by part of the group, over the ranks sharing them.
  const StageState state = stage_.host_state();
  const bool sharded = layout_of(state, 0) != nullptr;
  struct Copies {
    std::vector<const ParameterSpec*> specs;
    std::vector<uint64_t> lo;
  } replicated, shared;
  for (const auto& spec : stage_.table().specs()) {
    const float* mine = state.params + spec.offset;
    int64_t first = 0, rows = spec.numel() / spec.row_length();
    if (sharded) {
      const TensorPart p = state.shards->part_of(spec);
      mine = state.params + p.shard_offset;
      first = p.row_begin;
      rows = p.row_end - p.row_begin;
    }
    if (spec.whole()) {
      replicated.specs.push_back(&spec);
      replicated.lo.push_back(tensor_checksum(mine, rows * spec.row_length()));
    }
    const ParameterSpec::Rows r = spec.shared_rows_in(first, first + rows);
    if (spec.share() > 1) {
      shared.specs.push_back(&spec);
      shared.lo.push_back(tensor_checksum(mine + (r.begin - first) * spec.row_length(),
                                          (r.end - r.begin) * spec.row_length()));
    }
  }
  auto compare = [&](const Copies& c, MpiCommunicator& group, const char* what) {
    std::vector<uint64_t> lo = c.lo, hi = c.lo;
    const int count = static_cast<int>(lo.size());
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, lo.data(), count, MPI_UINT64_T, MPI_MIN, group.get()));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, hi.data(), count, MPI_UINT64_T, MPI_MAX, group.get()));
    for (size_t i = 0; i < lo.size(); ++i) {
      if (lo[i] != hi[i]) {
        throw SystemError(strprintf("stage %d, replica %d: the %s copies of %s differ", grid_.stage(),
                                    grid_.dp_rank(), what, c.specs[i]->name.c_str()));
      }
    }
  };
  compare(replicated, grid_.tensor_parallel(), "tensor group's");
  if (MpiCommunicator* kv = grid_.kv_heads()) compare(shared, *kv, "kv heads' shared");
  if (grid_.world_rank() == 0) {
    std::printf("tensor groups: every rank's replicated tensors match its group's (%d on stage 0",
                static_cast<int>(replicated.lo.size()));
    if (grid_.kv_heads() != nullptr)
      std::printf("; the kv heads' rows of %d on the ranks sharing them",
                  static_cast<int>(shared.lo.size()));
    std::printf(")\n");
  }
}

void CheckpointManager::check_tied_embedding() {
  MpiCommunicator* tied = grid_.tied_embedding();
  const ParameterSpec* tied_wte = stage_.table().tied_embedding();
  if (tied == nullptr || tied_wte == nullptr) return;  // untied: the grid's pair is unused
  // The last stage sends its copy; the first compares bit for bit. Under
  // ZeRO each pair compares the part it owns (cut alike on both stages).
  const ParameterSpec& wte = *tied_wte;
  const StageState state = stage_.host_state();
  float* mine = state.params + wte.offset;
  int64_t n = wte.storage;
  if (layout_of(state, 0) != nullptr) {
    const ShardUnit& u = state.shards->unit_at(wte.offset);
    mine = state.params + u.shard_offset;
    n = state.shards->part_size(u);
  }
  if (tied->rank() == 1) {
    tied->start_send(mine, n, 0, 0)->wait();
    return;
  }
  std::vector<float> theirs(static_cast<size_t>(n));
  tied->recv(theirs.data(), n, 1, 0);
  if (std::memcmp(theirs.data(), mine, sizeof(float) * theirs.size()) != 0) {
    throw SystemError("the tied embedding's copies on the first and last stage differ");
  }
  if (grid_.world_rank() == 0) {
    std::printf("tied embedding: first and last stage copies are identical\n");
  }
}

}  // namespace mpiformer
