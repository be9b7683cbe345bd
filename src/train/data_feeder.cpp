#include "train/data_feeder.hpp"

#include <algorithm>

#include "common/context_chunks.hpp"
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

// Every dataset of a run holds the same tokens: the first source's
// vocabulary and tokenizer.
void check_same_label(const TokenDataset& d, const TokenDataset& first, const std::string& key) {
  if (d.tokenizer() != first.tokenizer()) {
    throw InputError(d.path(), key + " tokenizer",
                     "\"" + d.tokenizer() + "\" differs from " + first.path() + "'s \"" +
                         first.tokenizer() + "\"");
  }
  if (d.vocab_size() != first.vocab_size()) {
    throw InputError(d.path(), key + " vocab_size",
                     strprintf("%lld differs from %s's %lld", static_cast<long long>(d.vocab_size()),
                               first.path().c_str(), static_cast<long long>(first.vocab_size())));
  }
}

// [data] train alone is a blend of one, named "train".
std::vector<DataSource> sources_of(const Deck& deck) {
  if (!deck.data.sources.empty()) return deck.data.sources;
  if (deck.data.train.empty()) {
    throw InputError(deck.path, "[data] train",
                     "empty: name a token dataset (a file or a glob), or [[data.source]] tables");
  }
  return {DataSource{"train", deck.data.train, 1.0, ""}};
}

}  // namespace

DataFeeder::DataFeeder(const Deck& deck, GptConfig& cfg)
    : blended_(!deck.data.sources.empty()),
      reblend_(deck.data.reblend),
      micro_batch_(deck.train.micro_batch),
      seq_len_(cfg.seq_len),
      global_batch_(deck.train.global_batch),
      eval_batches_(deck.train.eval_batches),
      document_mask_(deck.data.document_mask) {
  const DataLabel label{deck.data.vocab_size, deck.data.tokenizer};
  const uint64_t seed = static_cast<uint64_t>(deck.train.seed);
  std::vector<double> weights;
  for (const DataSource& s : sources_of(deck)) {
    const std::string key = blended_ ? "[[data.source]] \"" + s.name + "\"" : "[data] train";
    TrainSource t{s.name, s.weight, TokenDataset(s.path, label), nullptr, ""};
    if (sources_.empty() && cfg.vocab_size == 0) cfg.vocab_size = t.data.vocab_size();
    if (!sources_.empty()) check_same_label(t.data, sources_.front().data, key);
    check_dataset(t.data, cfg, key);
    // A single source keeps the plain order's stream (runs from before
    // blends draw the same windows).
    t.order = std::make_unique<SampleOrder>(
        t.data.num_windows(seq_len_), seed,
        blended_ ? "sample_order/" + s.name : std::string("sample_order"));
    t.fingerprint = t.data.fingerprint();
    weights.push_back(s.weight);
    sources_.push_back(std::move(t));
  }
  const TokenDataset& first = sources_.front().data;
  const auto add_eval = [&](const std::string& name, const std::string& source, double weight,
                            const std::string& path, const std::string& key) {
    EvalSet e{name, source, weight, TokenDataset(path, label), {}};
    check_same_label(e.data, first, key);
    check_dataset(e.data, cfg, key);
    eval_.push_back(std::move(e));
  };
  if (!deck.data.val.empty()) add_eval("val", "", 0, deck.data.val, "[data] val");
  for (const DataSource& s : deck.data.sources)
    if (!s.val.empty())
      add_eval("val/" + s.name, s.name, s.weight, s.val, "[[data.source]] \"" + s.name + "\" val");
  weights_ = weights;
  blend_ = std::make_unique<BlendOrder>(weights_);
  draw_step();  // a feeder starts at sample 0 until start_at says otherwise
}

void DataFeeder::plan(int slots, int dp, int dp_rank, int cp, int cp_rank, ContextChunks order) {
  dp_ = dp;
  dp_rank_ = dp_rank;
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp || (cp > 1 && seq_len_ % (2 * cp) != 0))
    throw std::logic_error("DataFeeder::plan: a context rank the deck does not allow");
  cp_ = cp;
  cp_rank_ = cp_rank;
  cp_order_ = order;
  const int64_t BT = micro_batch_ * seq_len_ / cp;
  inputs_.assign(static_cast<size_t>(slots), std::vector<int32_t>(static_cast<size_t>(BT)));
  targets_.assign(static_cast<size_t>(slots), std::vector<int32_t>(static_cast<size_t>(BT)));
  if (has_positions())
    positions_.assign(static_cast<size_t>(slots), std::vector<int32_t>(static_cast<size_t>(BT)));
  window_.resize(static_cast<size_t>(seq_len_ + 1));
  window_positions_.resize(static_cast<size_t>(seq_len_));
  // Each set fixed: eval_batches global batches of windows spread evenly
  // over its data, in whole micro-batches on every replica.
  for (EvalSet& e : eval_) {
    e.windows.clear();
    const int64_t have = e.data.num_windows(seq_len_), unit = micro_batch_ * dp;
    int64_t want = std::min(eval_batches_ * global_batch_, have);
    want -= want % unit;
    if (want == 0) {
      throw InputError(e.data.path(), e.source.empty() ? "[data] val" : "[[data.source]] val",
                       strprintf("%lld windows of %lld tokens: fewer than one micro-batch on "
                                 "each replica (%lld)",
                                 static_cast<long long>(have), static_cast<long long>(seq_len_ + 1),
                                 static_cast<long long>(unit)));
    }
    for (int64_t k = 0; k < want; ++k) e.windows.push_back(k * have / want);
  }
}

void DataFeeder::load(const TokenDataset& d, int64_t window, int slot, int64_t b) {
  d.read_window(window, seq_len_, window_.data());
  // Each token's position: in its document, or in the window.
  int32_t* wpos = window_positions_.data();
  if (document_mask_) {
    d.window_document_starts(window, seq_len_, window_.data(), &starts_);
    size_t next = 0;
    int32_t start = 0;
    for (int32_t i = 0; i < static_cast<int32_t>(seq_len_); ++i) {
      if (next < starts_.size() && starts_[next] == i) start = starts_[next++];
      wpos[i] = i - start;
    }
  } else {
    for (int32_t i = 0; i < static_cast<int32_t>(seq_len_); ++i) wpos[i] = i;
  }
  // The pieces of the window this rank holds: all of it at row b, or (cp >
  // 1) its two chunks, chunk-major.
  const int pieces = cp_ > 1 ? 2 : 1;
  const int64_t n = seq_len_ / (pieces * cp_);
  const ContextChunkPair chunks = context_chunks(cp_rank_, cp_, cp_order_);
  for (int j = 0; j < pieces; ++j) {
    const int64_t from = cp_ > 1 ? (j == 0 ? chunks.first : chunks.second) * n : 0;
    const int64_t to = (j * micro_batch_ + b) * n;
    std::copy_n(window_.begin() + from, n, inputs_[slot].begin() + to);
    std::copy_n(window_.begin() + from + 1, n, targets_[slot].begin() + to);
    if (has_positions()) std::copy_n(wpos + from, n, positions_[slot].begin() + to);
  }
}

void DataFeeder::draw_step() {
  at_cursor_ = blend_->counts();  // same size each step: no allocation
  step_.resize(static_cast<size_t>(global_batch_));
  for (auto& d : step_) d = blend_->next();
}

void DataFeeder::load_train(int micro, int slot) {
  for (int64_t b = 0; b < micro_batch_; ++b) {
    const int64_t j = (static_cast<int64_t>(micro) * dp_ + dp_rank_) * micro_batch_ + b;
    const BlendOrder::Draw d = step_[static_cast<size_t>(j)];
    TrainSource& s = sources_[static_cast<size_t>(d.source)];
    load(s.data, s.order->window(d.index), slot, b);
  }
}

void DataFeeder::load_eval(int micro, int slot) {
  // Evaluation micro-batch k of the whole set goes to replica k % dp.
  const EvalSet& e = eval_[eval_at_];
  const int64_t k = static_cast<int64_t>(micro) * dp_ + dp_rank_;
  for (int64_t b = 0; b < micro_batch_; ++b) load(e.data, e.windows[k * micro_batch_ + b], slot, b);
}

int DataFeeder::eval_micro_batches() const {
  return static_cast<int>(eval_[eval_at_].windows.size() / static_cast<size_t>(micro_batch_ * dp_));
}

BlendRecord DataFeeder::describe() const {
  BlendRecord r;
  r.start = blend_->start();
  // The counts at the cursor: the blend has already drawn the step there.
  const std::vector<int64_t>& at = at_cursor_;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const TrainSource& s = sources_[i];
    r.sources.push_back({s.name, s.weight, s.order->num_windows(), s.fingerprint,
                         blend_->base()[i], at[i]});
  }
  return r;
}

std::string DataFeeder::record() const { return describe().to_text(); }

std::string DataFeeder::start_at(bool resumed, int64_t cursor, const std::string& text,
                                 const std::string& checkpoint) {
  cursor_ = cursor;
  std::string said;
  step_.clear();
  blend_ = std::make_unique<BlendOrder>(weights_);
  if (!resumed) {
    draw_step();
    return said;
  }
  if (text.empty()) {
    // Before blends a checkpoint held one source, whose count is the cursor.
    if (sources_.size() != 1) {
      throw InputError(checkpoint, "attribute data_blend",
                       "missing (written before blends, by a run of one source): this deck "
                       "blends " + std::to_string(sources_.size()) + " sources");
    }
    blend_->restore(cursor, {cursor});
    draw_step();
    return said;
  }
  const BlendRecord was = BlendRecord::parse(text, checkpoint);
  BlendRecord now = describe();
  const std::string changed = BlendRecord::differences(was, now);
  int64_t was_at = was.start;
  std::vector<int64_t> was_base, was_counts;
  for (const BlendEntry& e : was.sources) {
    was_base.push_back(e.base);
    was_counts.push_back(e.count);
    was_at += e.count - e.base;
  }
  if (was_at != cursor) {
    throw InputError(checkpoint, "attribute data_blend",
                     strprintf("its counts reach sample %lld, the checkpoint's position is %lld",
                               static_cast<long long>(was_at), static_cast<long long>(cursor)));
  }
  if (changed.empty()) {
    // The recorded state of this very blend: O(k), no walk from its start.
    blend_ = std::make_unique<BlendOrder>(weights_, was.start, was_base);
    const std::string why = blend_->restore(cursor, was_counts);
    if (!why.empty()) throw InputError(checkpoint, "attribute data_blend", why);
  } else if (!reblend_) {
    throw InputError(checkpoint, "[[data.source]]",
                     "the deck's blend differs from the one this run trained on: " + changed +
                         ". Restore the blend, or set [data] reblend = true to blend the deck's "
                         "sources from this checkpoint on");
  } else {
    // A new blend from the cursor; each source the checkpoint knew, with the
    // same files, goes on from its own position (its epochs continue).
    std::vector<int64_t> base;
    for (const TrainSource& s : sources_) {
      int64_t from = 0;
      for (const BlendEntry& e : was.sources)
        if (e.name == s.name && e.fingerprint == s.fingerprint) from = e.count;
      base.push_back(from);
    }
    blend_ = std::make_unique<BlendOrder>(weights_, cursor, base);
    said = strprintf("data: re-blended from sample %lld ([data] reblend): %s",
                     static_cast<long long>(cursor), changed.c_str());
  }
  draw_step();
  return said;
}

std::vector<std::string> DataFeeder::next_step() {
  const std::vector<int64_t>& before = at_cursor_;
  cursor_ += global_batch_;
  std::vector<std::string> notes;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const int64_t n = sources_[i].order->num_windows();
    const int64_t was = before[i] / n, is = blend_->counts()[i] / n;
    if (is > was) {
      notes.push_back(strprintf("data: source \"%s\" begins epoch %lld (its %lld windows seen "
                                "%lld time%s so far)",
                                sources_[i].name.c_str(), static_cast<long long>(is + 1),
                                static_cast<long long>(n), static_cast<long long>(is),
                                is == 1 ? "" : "s"));
    }
  }
  draw_step();
  return notes;
}

double DataFeeder::attention_kept(int64_t windows) const {
  double kept = 0, weights = 0;
  std::vector<int32_t> tokens(static_cast<size_t>(seq_len_ + 1)), starts;
  const double T = static_cast<double>(seq_len_), all = T * (T + 1) / 2;
  for (const TrainSource& s : sources_) {
    const int64_t n = std::min(windows, s.data.num_windows(seq_len_));
    double share = 0;
    for (int64_t w = 0; w < n; ++w) {
      s.data.read_window(w, seq_len_, tokens.data());
      s.data.window_document_starts(w, seq_len_, tokens.data(), &starts);
      starts.push_back(static_cast<int32_t>(seq_len_));
      double pairs = 0;
      int32_t from = 0;
      for (const int32_t to : starts) {
        const double l = to - from;
        pairs += l * (l + 1) / 2;
        from = to;
      }
      share += pairs / all;
    }
    if (n > 0) {
      kept += s.weight * share / static_cast<double>(n);
      weights += s.weight;
    }
  }
  return weights > 0 ? kept / weights : 1.0;
}

int64_t DataFeeder::epoch() const {
  const BlendRecord r = describe();
  int64_t e = 0;
  for (const BlendEntry& s : r.sources) e = std::max(e, s.count / std::max<int64_t>(1, s.windows));
  return e;
}

}  // namespace mpiformer
