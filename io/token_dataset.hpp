// A token dataset, read-only, in either of two formats detected by content:
//  - HDF5: a 1-D unsigned integer dataset /tokens, root attributes
//    vocab_size (integer) and tokenizer (string), and max_token_id
//    (integer, optional: prep writes it); optionally /documents, each
//    document's first token (prep writes it);
//  - llm.c .bin shards: a 256 x int32 header (magic 20240520, version 1,
//    token count) then uint16 tokens; one file or a glob of several;
//  - Megatron-LM's indexed datasets: a .bin of raw tokens beside its .idx
//    (megatron_dataset.hpp); name either file, or a glob of them.
// A sample is a window of seq_len + 1 consecutive tokens (inputs and the
// targets shifted by one); windows are laid end to end with a stride of
// seq_len and never cross a file boundary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mpiformer {

class TokenSource;

// What the deck says a dataset holds ([data] vocab_size, [data] tokenizer;
// 0 and "" where it does not say): the label of files without one (a
// Megatron .bin/.idx, an llm.c shard), which are otherwise taken to hold
// GPT-2's tokens (bytes for a uint8 Megatron file); checked against the
// label of files that have one.
struct DataLabel {
  int64_t vocab_size = 0;
  std::string tokenizer;
};

class TokenDataset {
 public:
  // Opens and checks every file in O(1) of its size: a regular file, the
  // format, the header's sizes, max_token_id below vocab_size where the
  // file has it. Token ids are checked below vocab_size as they are read
  // (a corpus of 10^12 tokens opens at once). Errors name the file and
  // what is wrong.
  explicit TokenDataset(const std::string& path_or_glob, const DataLabel& given = {});
  ~TokenDataset();
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const;
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& tokenizer() const { return tokenizer_; }
  std::string format() const;

  // Windows of seq_len + 1 tokens the dataset holds.
  int64_t num_windows(int64_t seq_len) const;
  // Window `index` (0 <= index < num_windows) into out[seq_len + 1].
  void read_window(int64_t index, int64_t seq_len, int32_t* out) const;
  // The documents starting inside window `index` (whose tokens are
  // `tokens`, as read_window gave them): offsets i in (0, seq_len) into the
  // window, increasing. From the file's record (HDF5 /documents, a Megatron
  // index) or, where it has none, GPT-2's <|endoftext|>; none otherwise.
  void window_document_starts(int64_t index, int64_t seq_len, const int32_t* tokens,
                              std::vector<int32_t>* starts) const;
  // Documents the files record (-1: some file records none), and how the
  // dataset knows its documents ("recorded", "token N starts each", "none").
  int64_t num_documents() const;
  std::string document_source() const;
  // Any `count` consecutive tokens of the whole dataset (for inspection).
  void read_tokens(int64_t first, int64_t count, int32_t* out) const;
  // A digest of what the files are: each one's format, token count and
  // its first and last 4 KiB (headers, and the data's ends), in order. Two
  // ranks, or a run and its checkpoint, that see the same dataset agree on
  // it; a file rewritten, cut or swapped gives another. 16 hex digits.
  std::string fingerprint() const;
  // Reads every token and checks it is below vocab_size (inspect's full
  // check, linear in the size); returns the largest id (-1: empty).
  int64_t verify_token_range() const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<TokenSource>> files_;
  int64_t vocab_size_ = 0;
  std::string tokenizer_;
};

// Writes `tokens` as an HDF5 token dataset (the format above); the file is
// written under a temporary name and renamed, so a failure leaves no half file.
// `documents`: each document's first token (0 first, increasing), written
// as /documents; empty: none recorded.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      int64_t vocab_size, const std::string& tokenizer,
                      const std::vector<int64_t>& documents = {});

}  // namespace mpiformer
