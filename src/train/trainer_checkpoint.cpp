// Resuming from and writing checkpoints, and the tied-embedding check.
#include "train/trainer.hpp"

#include "train/trainer_state.hpp"

namespace mpiformer {

void Trainer::resume() {
  State& s = *st_;
  const CheckpointConfig& cc = deck_.checkpoint;
  if (cc.resume == "never") return;
  const bool automatic = cc.resume == "auto";
  // Rank 0 decides what to try (file systems may disagree between nodes):
  // `latest` first, then every complete checkpoint, newest first.
  std::string list;
  if (rank_ == 0) {
    if (!automatic) {
      list = cc.resume;
    } else {
      const CheckpointStore store(cc.dir);
      std::vector<std::string> names;
      if (const std::string l = store.latest(); !l.empty()) names.push_back(l);
      for (const auto& p : store.complete())
        if (std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
      for (const auto& n : names) list += n + "\n";
    }
  }
  int len = static_cast<int>(list.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  list.resize(static_cast<size_t>(len));
  MPI_Bcast(list.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> candidates;
  for (size_t a = 0, b; a < list.size(); a = b + 1) {
    b = list.find('\n', a);
    if (b == std::string::npos) b = list.size();
    if (b > a) candidates.push_back(list.substr(a, b - a));
  }

  StageBackend& stage = *s.stage;
  const int64_t n = stage.param_storage();
  std::string last_error;
  for (const auto& path : candidates) {
    std::vector<float> params(n), m(n), v(n);
    CheckpointMeta meta;
    try {
      // Never half-loaded: every rank reads into scratch, all agree, then commit.
      agree_on_input_errors(MPI_COMM_WORLD, [&] {
        CheckpointReader reader(path);
        restore_stage(reader, s.cfg, stage.table(), StageState{params.data(), m.data(), v.data()});
        meta = reader.meta();
      });
    } catch (const InputError& e) {
      if (!automatic) throw;
      last_error = e.what();
      if (rank_ == 0) {
        std::fprintf(stderr, "mpiformer: warning: cannot resume from %s: %s; trying an older one\n",
                     path.c_str(), e.what());
      }
      continue;
    }
    stage.load_state(params.data(), m.data(), v.data());
    s.start_step = meta.step;
    s.cursor = meta.sample_position;
    s.resumed = true;
    if (rank_ == 0) {
      std::printf("resumed from %s: step %lld, %lld samples seen (epoch %lld), written by "
                  "dp %lld x pp %lld on %lld rank(s); now dp %lld x pp %lld\n",
                  path.c_str(), static_cast<long long>(meta.step),
                  static_cast<long long>(meta.sample_position), static_cast<long long>(meta.epoch),
                  static_cast<long long>(meta.dp), static_cast<long long>(meta.pp),
                  static_cast<long long>(meta.world_size), static_cast<long long>(deck_.parallel.dp),
                  static_cast<long long>(deck_.parallel.pp));
      std::fflush(stdout);
    }
    return;
  }
  if (!candidates.empty()) {
    throw InputError(cc.dir, "[checkpoint] resume",
                     "no checkpoint here could be loaded (last error: " + last_error +
                         "); set [checkpoint] resume = \"never\" to start afresh");
  }
}

void Trainer::save_checkpoint(int64_t step) {
  State& s = *st_;
  const auto t0 = Clock::now();
  const CheckpointStore store(deck_.checkpoint.dir);
  store.create_dir();
  CheckpointMeta meta;
  meta.step = step;
  meta.sample_position = s.cursor;
  meta.tokens_seen = s.cursor * s.cfg.seq_len;
  meta.epoch = s.order->epoch(s.cursor);
  meta.seed = deck_.train.seed;
  meta.dp = deck_.parallel.dp;
  meta.pp = deck_.parallel.pp;
  meta.world_size = deck_.parallel.dp * deck_.parallel.pp;
  set_model_config(meta, s.cfg);
  meta.tokenizer = s.train.tokenizer();
  meta.deck = deck_.to_toml();
  const std::string path = store.path_for_step(step);
  const auto slices = checkpoint_slices(s.cfg, s.stage->table(), s.stage->host_state(), *s.grid);
  write_checkpoint(MPI_COMM_WORLD, path, meta, slices);
  if (rank_ == 0) {
    store.publish_latest(path);
    store.prune(deck_.checkpoint.keep);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double dt = seconds(t0, Clock::now());
  if (rank_ == 0) {
    const ParameterTable whole(s.cfg, StageRange{0, s.cfg.n_layer, true, true});
    const double mb = 3.0 * 4.0 * static_cast<double>(whole.total_numel()) / 1e6;
    std::printf("checkpoint: wrote %s (%.1f MB in %.2f s, %.0f MB/s)\n", path.c_str(), mb, dt,
                mb / dt);
    std::fflush(stdout);
  }
}

void Trainer::check_tied_embedding() {
  State& s = *st_;
  MpiCommunicator* tied = s.grid->tied_embedding();
  if (tied == nullptr) return;
  // The last stage sends its copy; the first compares bit for bit.
  const auto& wte = s.stage->table().at("wte");
  float* mine = s.stage->host_state().params + wte.offset;
  if (tied->rank() == 1) {
    tied->start_send(mine, wte.storage, 0, 0)->wait();
    return;
  }
  std::vector<float> theirs(static_cast<size_t>(wte.storage));
  tied->recv(theirs.data(), wte.storage, 1, 0);
  if (std::memcmp(theirs.data(), mine, sizeof(float) * theirs.size()) != 0) {
    throw SystemError("the tied embedding's copies on the first and last stage differ");
  }
  if (rank_ == 0) std::printf("tied embedding: first and last stage copies are identical\n");
}

}  // namespace mpiformer
