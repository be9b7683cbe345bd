#include "train/data_feeder.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace {

void check_dataset(const TokenDataset& d, const GptConfig& cfg, const std::string& key) {
  if (d.vocab_size() > cfg.vocab_size) {
    throw InputError(d.path(), "vocab_size",
                     strprintf("the data's vocabulary (%lld) exceeds [model] vocab_size (%lld)",
                               static_cast<long long>(d.vocab_size()),
                               static_cast<long long>(cfg.vocab_size)));
  }
  if (d.num_windows(cfg.seq_len) < 1) {
    throw InputError(d.path(), key,
                     strprintf("%lld tokens: too few for one sample of [model] seq_len + 1 = %lld",
                               static_cast<long long>(d.num_tokens()),
                               static_cast<long long>(cfg.seq_len + 1)));
  }
}

}  // namespace

namespace {

const std::string& train_path(const Deck& deck) {
  if (deck.data.train.empty()) {
    throw InputError(deck.path, "[data] train", "empty: name a token dataset (a file or a glob)");
  }
  return deck.data.train;
}

}  // namespace

DataFeeder::DataFeeder(const Deck& deck, GptConfig& cfg)
    : train_(train_path(deck), DataLabel{deck.data.vocab_size, deck.data.tokenizer}),
      micro_batch_(deck.train.micro_batch),
      seq_len_(cfg.seq_len),
      global_batch_(deck.train.global_batch),
      eval_batches_(deck.train.eval_batches) {
  if (cfg.vocab_size == 0) cfg.vocab_size = train_.vocab_size();
  check_dataset(train_, cfg, "[data] train");
  if (!deck.data.val.empty()) {
    val_ = std::make_unique<TokenDataset>(deck.data.val,
                                          DataLabel{deck.data.vocab_size, deck.data.tokenizer});
    check_dataset(*val_, cfg, "[data] val");
    if (val_->tokenizer() != train_.tokenizer()) {
      throw InputError(val_->path(), "tokenizer",
                       "'" + val_->tokenizer() + "' differs from the training data's '" +
                           train_.tokenizer() + "'");
    }
  }
  order_ = std::make_unique<SampleOrder>(train_.num_windows(seq_len_),
                                         static_cast<uint64_t>(deck.train.seed));
}

void DataFeeder::plan(int slots, int dp, int dp_rank) {
  dp_ = dp;
  dp_rank_ = dp_rank;
  const int64_t BT = micro_batch_ * seq_len_;
  inputs_.assign(static_cast<size_t>(slots), std::vector<int32_t>(static_cast<size_t>(BT)));
  targets_.assign(static_cast<size_t>(slots), std::vector<int32_t>(static_cast<size_t>(BT)));
  window_.resize(static_cast<size_t>(seq_len_ + 1));
  // A fixed evaluation set: eval_batches global batches of windows spread
  // evenly over the validation data, in whole micro-batches on every replica.
  eval_windows_.clear();
  if (!val_) return;
  const int64_t have = val_->num_windows(seq_len_), unit = micro_batch_ * dp;
  int64_t want = std::min(eval_batches_ * global_batch_, have);
  want -= want % unit;
  if (want == 0) {
    throw InputError(val_->path(), "[data] val",
                     strprintf("%lld windows of %lld tokens: fewer than one micro-batch on "
                               "each replica (%lld)",
                               static_cast<long long>(have), static_cast<long long>(seq_len_ + 1),
                               static_cast<long long>(unit)));
  }
  for (int64_t k = 0; k < want; ++k) eval_windows_.push_back(k * have / want);
}

void DataFeeder::load(const TokenDataset& d, int64_t window, int slot, int64_t b) {
  d.read_window(window, seq_len_, window_.data());
  std::copy(window_.begin(), window_.end() - 1, inputs_[slot].begin() + b * seq_len_);
  std::copy(window_.begin() + 1, window_.end(), targets_[slot].begin() + b * seq_len_);
}

void DataFeeder::load_train(int micro, int slot) {
  for (int64_t b = 0; b < micro_batch_; ++b) {
    const int64_t j = (static_cast<int64_t>(micro) * dp_ + dp_rank_) * micro_batch_ + b;
    load(train_, order_->window(cursor_ + j), slot, b);
  }
}

void DataFeeder::load_eval(int micro, int slot) {
  // Evaluation micro-batch k of the whole set goes to replica k % dp.
  const int64_t k = static_cast<int64_t>(micro) * dp_ + dp_rank_;
  for (int64_t b = 0; b < micro_batch_; ++b) {
    load(*val_, eval_windows_[k * micro_batch_ + b], slot, b);
  }
}

int DataFeeder::eval_micro_batches() const {
  return static_cast<int>(eval_windows_.size() / static_cast<size_t>(micro_batch_ * dp_));
}

}  // namespace mpiformer
