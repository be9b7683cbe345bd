// Megatron-LM's indexed dataset (MMapIndexedDataset, index version 1): a
// .bin of raw little-endian tokens and an .idx describing it:
//   magic "MMIDIDX\0\0" (9 bytes), version (uint64, 1), dtype code (uint8:
//   1 uint8, 3 int16, 4 int32, 5 int64, 8 uint16, ...), the sequence count
//   and the document count (uint64 each; documents + 1), then the
//   sequences' lengths (int32), their byte offsets in the .bin (int64) and
//   the document index (int64: the first sequence of each document, 0
//   first, the sequence count last).
// mpiformer reads the tokens in file order (documents back to back, as
// Megatron's GPT dataset concatenates them) and writes one sequence per
// document. The format holds no vocabulary: uint8 tokens are read as the
// byte tokenizer's (vocab 256), wider ones as GPT-2's (vocab 50257); ids
// are checked against it as they are read.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "token_source.hpp"

namespace mpiformer {

// Whether `path` names a Megatron dataset: an .idx, or a .bin beside an
// .idx. `bin` gets the data file's path.
bool is_megatron_dataset(const std::string& path, std::string* bin);

// Opens the pair, checking the index against the format and the .bin's
// size (linear in the sequences, not the tokens); sets the vocabulary and
// tokenizer the dtype implies. Errors name the file and the field.
std::unique_ptr<TokenSource> open_megatron_dataset(const std::string& bin, int64_t* vocab,
                                                   std::string* tokenizer);

// Writes OUT.bin and OUT.idx (OUT: `path` without its .bin) from `tokens`
// and where each document starts in them (`doc_starts`, increasing, 0
// first), in the narrowest dtype that holds vocab_size ids; each file
// under a temporary name, renamed when whole (the .idx last).
void write_megatron_dataset(const std::string& path, const std::vector<uint32_t>& tokens,
                            const std::vector<int64_t>& doc_starts, int64_t vocab_size);

}  // namespace mpiformer
