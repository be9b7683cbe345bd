// A token dataset (token_dataset.hpp's HDF5 format: /tokens, /documents,
// vocab_size, tokenizer, max_token_id) written by every rank of a
// communicator at once through parallel HDF5, each rank its own range of
// tokens and of document offsets, read from where it keeps them (prep's
// ranks: a scratch file each). Written under `path`.tmp and renamed by
// rank 0 once every rank's part is in: a failure leaves no half file.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mpiformer {

struct TokenFileLabel {
  int64_t vocab_size = 0;
  std::string tokenizer;
  int64_t max_token_id = -1;  // over the whole file (-1: no tokens)
};

// This rank's part: tokens [first, first + count) of the file, and
// /documents entries [docs_first, docs_first + docs) (offsets into the
// file's tokens). read(at, n, out): its tokens (or offsets) from its own
// position `at`.
struct TokenFilePart {
  int64_t first = 0, count = 0;
  std::function<void(int64_t at, int64_t n, uint32_t* out)> read_tokens;
  int64_t docs_first = 0, docs = 0;
  std::function<void(int64_t at, int64_t n, int64_t* out)> read_documents;
};

// Collective over `comm`. InputError naming the path when it cannot be
// written (on every rank).
void write_token_file_parts(MPI_Comm comm, const std::string& path, int64_t total_tokens,
                            int64_t total_documents, const TokenFileLabel& label,
                            const TokenFilePart& mine);

// The narrowest unsigned type that holds every id: a vocabulary of 256
// or fewer in one byte, of 65536 or fewer in two.
int64_t token_bytes(int64_t vocab_size);

}  // namespace mpiformer
