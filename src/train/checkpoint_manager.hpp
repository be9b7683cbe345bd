// The run's checkpoints: resuming (which checkpoint, all ranks agreeing,
// never half-loaded), saving (every rank its rows, then `latest` and
// retention), and the end-of-run check that the tied embedding's two copies
// are identical.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "deck.hpp"
#include "core/error.hpp"
#include "core/gpt_config.hpp"
#include "parallel/process_grid.hpp"
#include "train/loss_scaler.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

// Where a run starts: step 0 at sample 0, or a checkpoint's position.
struct ResumePoint {
  int64_t step = 0;
  int64_t cursor = 0;  // global sample position of the next step
  bool resumed = false;
  std::string run_id;  // a new one, or the resumed checkpoint's
  std::string path;        // the checkpoint resumed from
  std::string data_blend;  // its blend record ("": none, one source)
  // fp16's dynamic loss scaler as the checkpoint left it (has_scaler: it
  // recorded one; otherwise a run that scales starts afresh at 2^16).
  bool has_scaler = false;
  LossScaler::State scaler;
};

// Where the data stood after a step, as a checkpoint records it.
struct DataPosition {
  int64_t cursor = 0;
  int64_t epoch = 0;
  std::string blend;  // DataFeeder::record()
};

class CheckpointManager {
 public:
  CheckpointManager(const Deck& deck, const GptConfig& cfg, ProcessGrid& grid,
                    StageBackend& stage, std::string tokenizer);

  // Collective: restores the stage from [checkpoint] resume and says where
  // to start. Under "auto", a damaged checkpoint is reported and an older
  // one tried. Throws InputError when none can be loaded. Then sets aside
  // (moves, never deletes) every checkpoint in [checkpoint] dir that this
  // run did not write or that is past its start: a fresh run in an old
  // run's directory is never outranked or pruned by the old files.
  ResumePoint resume();
  // Collective: writes the checkpoint of `step`, publishes it as `latest`
  // and prunes old ones. Returns the seconds it took.
  // `scaler`: the run's loss scaler (its state is saved when dynamic).
  // kBackground ([checkpoint] async): returns once the file is laid out
  // (io/checkpoint.hpp) and each rank has copied what it writes, or, where
  // the state is the stage's own memory, left the copy to a thread
  // before the next update (settle_snapshot); a thread writes the
  // tensors, and finish_background publishes the file. No save while one
  // is in flight.
  // `mode`: kInline writes, reads back and publishes before returning;
  // kReadBackBehind ([checkpoint] read_back = "background") returns once
  // every rank's bytes are written and flushed, a thread reads them back,
  // and finish_background publishes the file; kBackground ([checkpoint]
  // async) is described above.
  enum class Mode { kInline, kReadBackBehind, kBackground };
  double save(int64_t step, const DataPosition& data, const LossScaler& scaler, Mode mode = Mode::kInline);
  // Collective: a background save whose writes are done on every rank is
  // checked and published (`wait`: waits for them first; otherwise one
  // still writing anywhere is left for later). Returns the seconds spent.
  double finish_background(bool wait);
  // Collective, before anything changes the state (the next step's
  // update): a background save's snapshot, copied beside that step's
  // forward and backward, is waited for and its finite scan agreed
  // (AgreedInputError, the partial file removed, where a rank's holds
  // NaN). Returns the seconds waited; nothing to do when none is pending.
  double settle_snapshot();
  bool background_pending() const { return background_ != nullptr; }
  // The last published save's read-back seconds on rank 0 (what a
  // kReadBackBehind save's inline twin would also have waited).
  double last_read_back_seconds() const { return last_read_back_; }
  ~CheckpointManager();
  // Collective: throws SystemError if the tied embedding's copies differ.
  // The end of a run: every rank of each tensor group holds the same bits
  // of the tensors the group replicates (SystemError naming one otherwise).
  // Collective over each tensor group.
  void check_tensor_replicas();
  void check_tied_embedding();

 private:
  const Deck& deck_;
  const GptConfig& cfg_;
  ProcessGrid& grid_;
  StageBackend& stage_;
  // Collective: the checkpoint loaded per [checkpoint] resume, if any.
  ResumePoint load();
  // Rank 0: moves aside what the run starting at `start` must not see.
  void set_aside_others(const ResumePoint& start) const;
  // What this rank writes of the state (`slices`): 0 finite, 1 NaN or
  // infinity in the moments, 2 in the weights.
  int nonfinite_state(const std::vector<DatasetSlice>& slices, const StageState& state) const;
  // Collective: an AgreedInputError when any rank's `bad` (as above) is not 0.
  void refuse_nonfinite(int bad, int64_t step);
  // Collective: the worst of every rank's `bad`; and the refusal it makes.
  int agreed_nonfinite(int bad);
  AgreedInputError nonfinite_refusal(int worst, int64_t step) const;

  AgreedInputError no_space(int64_t step, double need, double free, const std::string& what) const;
  AgreedInputError write_refused(const CheckpointWriteError& e, int64_t step, double need,
                                 double free) const;
  double checkpoint_mb() const;  // the whole model's params, m and v
  // Collective: `latest` moves to `path`, and older checkpoints beyond
  // [checkpoint] keep go.
  void publish(const std::string& path);

  std::string tokenizer_;
  std::string run_id_;
  struct Background;
  std::unique_ptr<Background> background_;
  // A published background save's snapshot buffers, for the next one.
  std::vector<std::vector<float>> spare_snapshot_;
  double last_read_back_ = 0;
};

}  // namespace mpiformer
