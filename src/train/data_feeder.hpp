// What a rank feeds its stage: training micro-batches read in a seeded
// global order from a cursor, and a fixed evaluation set. The cursor counts
// global samples, so a run resumed under another layout continues exactly
// where it stopped.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "deck.hpp"
#include "core/gpt_config.hpp"
#include "token_dataset.hpp"
#include "train/sample_order.hpp"

namespace mpiformer {

class DataFeeder {
 public:
  // Opens [data] train and val and checks them against the model; a deck
  // with vocab_size 0 takes it from the training data (written to `cfg`).
  // Local: throws InputError naming the file.
  DataFeeder(const Deck& deck, GptConfig& cfg);

  // Plans the token buffers of `slots` micro-batches in flight and the
  // evaluation set for replica `dp_rank` of `dp`. Local.
  void plan(int slots, int dp, int dp_rank);

  const TokenDataset& train() const { return train_; }
  const TokenDataset* val() const { return val_.get(); }
  const SampleOrder& order() const { return *order_; }

  // Micro-batch `micro` of the step at the cursor, into `slot`: sample j of
  // a step lives at global position cursor + j whichever rank reads it;
  // replica r's micro-batch m holds samples (m * dp + r) * micro_batch + b.
  void load_train(int micro, int slot);
  // Evaluation micro-batch `micro` of this replica, into `slot`.
  void load_eval(int micro, int slot);
  const int32_t* inputs(int slot) const { return inputs_[slot].data(); }
  const int32_t* targets(int slot) const { return targets_[slot].data(); }
  // Evaluation micro-batches this replica runs, and windows over all replicas.
  int eval_micro_batches() const;
  int64_t eval_windows() const { return static_cast<int64_t>(eval_windows_.size()); }

  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t c) { cursor_ = c; }
  void next_step() { cursor_ += global_batch_; }
  int64_t epoch() const { return order_->epoch(cursor_); }

 private:
  void load(const TokenDataset& d, int64_t window, int slot, int64_t b);
  TokenDataset train_;
  std::unique_ptr<TokenDataset> val_;
  std::unique_ptr<SampleOrder> order_;
  int64_t micro_batch_, seq_len_, global_batch_, eval_batches_;
  int dp_ = 1, dp_rank_ = 0;
  std::vector<int64_t> eval_windows_;
  std::vector<std::vector<int32_t>> inputs_, targets_;  // one per slot
  std::vector<int32_t> window_;
  int64_t cursor_ = 0;
};

}  // namespace mpiformer
