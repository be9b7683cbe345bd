// What a rank feeds its stage: training micro-batches drawn from the
// deck's sources (one, or a weighted blend) in a seeded global order from
// a cursor, and fixed evaluation sets. The cursor counts global samples,
// so a run resumed under another layout continues exactly where it
// stopped: which source a sample comes from is blend_order.hpp's, which of
// that source's windows it is, the source's own SampleOrder.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deck.hpp"
#include "core/gpt_config.hpp"
#include "token_dataset.hpp"
#include "train/blend_order.hpp"
#include "train/blend_record.hpp"
#include "train/sample_order.hpp"

namespace mpiformer {

// One training source: its dataset, its share and its own order of windows.
struct TrainSource {
  std::string name;
  double weight = 1;
  TokenDataset data;
  std::unique_ptr<SampleOrder> order;
  std::string fingerprint;
};

// A fixed evaluation set: [data] val ("val") or a source's own ("val/<name>").
struct EvalSet {
  std::string name;
  std::string source;  // "" for [data] val
  double weight = 0;   // the source's, for the blended loss
  TokenDataset data;
  std::vector<int64_t> windows;  // over all replicas
};

class DataFeeder {
 public:
  // Opens the sources and evaluation sets and checks them against the model
  // and each other (one vocabulary and tokenizer); a deck with vocab_size 0
  // takes it from the training data (written to `cfg`). Local: throws
  // InputError naming the file.
  DataFeeder(const Deck& deck, GptConfig& cfg);

  // Plans the token buffers of `slots` micro-batches in flight and the
  // evaluation sets for data replica `dp_rank` of `dp`. Under context
  // parallelism (cp > 1) the replica's sequences are split over cp ranks:
  // this one, `cp_rank`, gets chunks cp_rank and 2 cp - 1 - cp_rank of 2 cp
  // from each, chunk-major ([2, micro_batch, seq_len / (2 cp)]: the
  // micro-batch's first chunks, then its second), with their positions in
  // the sequence; `order` may make them chunks 2 cp_rank and 2 cp_rank + 1
  // (common/context_chunks.hpp). Local.
  void plan(int slots, int dp, int dp_rank, int cp = 1, int cp_rank = 0,
            ContextChunks order = ContextChunks::kHeadTail);

  const std::vector<TrainSource>& sources() const { return sources_; }
  bool blended() const { return blended_; }
  const std::string& tokenizer() const { return sources_.front().data.tokenizer(); }
  const std::vector<EvalSet>& eval_sets() const { return eval_; }

  // Micro-batch `micro` of the step at the cursor, into `slot`: sample j of
  // a step lives at global position cursor + j whichever rank reads it;
  // replica r's micro-batch m holds samples (m * dp + r) * micro_batch + b.
  void load_train(int micro, int slot);
  // Evaluation micro-batch `micro` of this replica from the selected set.
  void select_eval(size_t set) { eval_at_ = set; }
  void load_eval(int micro, int slot);
  const int32_t* inputs(int slot) const { return inputs_[slot].data(); }
  const int32_t* targets(int slot) const { return targets_[slot].data(); }
  // [data] document_mask: each input token's position in its document
  // (restarting at the window's start and at each document's); under
  // context parallelism its position in the window; nullptr otherwise.
  const int32_t* positions(int slot) const {
    return has_positions() ? positions_[slot].data() : nullptr;
  }
  // Whether every stage reads the positions (its attention and rotations
  // do), not only the ends' the tokens and targets.
  bool has_positions() const { return document_mask_ || cp_ > 1; }
  // Of causal attention's key-query pairs, the share within one document:
  // over the first `windows` windows of each source, weighted as blended
  // (1 without documents in them).
  double attention_kept(int64_t windows = 64) const;
  // Evaluation micro-batches this replica runs of the selected set, and
  // its windows over all replicas.
  int eval_micro_batches() const;
  int64_t eval_windows() const { return static_cast<int64_t>(eval_[eval_at_].windows.size()); }

  int64_t cursor() const { return cursor_; }
  // Where the run starts: a fresh run at 0, or a resumed one at its
  // checkpoint's position with its blend record ("": a checkpoint from
  // before blends, of one source). Called once, before the first step. A record whose
  // blend differs from the deck's is refused (InputError naming each
  // difference) unless [data] reblend, which starts the deck's blend at the
  // cursor, each unchanged source going on from its own position; returns
  // what the log should say of it ("" when nothing changed).
  std::string start_at(bool resumed, int64_t cursor, const std::string& record,
                       const std::string& checkpoint);
  // After a step: the cursor moves a global batch on. Returns a line for
  // each source that began a new epoch in the step.
  std::vector<std::string> next_step();
  // The furthest epoch any source is in (the checkpoint's "epoch").
  int64_t epoch() const;
  // The blend's record at the cursor, for a checkpoint.
  std::string record() const;

 private:
  void load(const TokenDataset& d, int64_t window, int slot, int64_t b);
  // The sources of the step at the cursor (the blend walked over it).
  void draw_step();
  BlendRecord describe() const;

  std::vector<TrainSource> sources_;
  bool blended_ = false;
  bool reblend_ = false;
  std::vector<EvalSet> eval_;
  size_t eval_at_ = 0;
  std::vector<double> weights_;  // the sources', as the deck gives them
  std::unique_ptr<BlendOrder> blend_;
  std::vector<BlendOrder::Draw> step_;  // the global batch at the cursor
  std::vector<int64_t> at_cursor_;      // each source's samples before it
  int64_t micro_batch_, seq_len_, global_batch_, eval_batches_;
  int dp_ = 1, dp_rank_ = 0, cp_ = 1, cp_rank_ = 0;
  ContextChunks cp_order_ = ContextChunks::kHeadTail;
  std::vector<std::vector<int32_t>> inputs_, targets_;  // one per slot
  bool document_mask_ = false;
  std::vector<std::vector<int32_t>> positions_;  // one per slot (document_mask)
  std::vector<int32_t> window_, starts_, window_positions_;
  int64_t cursor_ = 0;
};

}  // namespace mpiformer
