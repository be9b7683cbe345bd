// Checkpoints: one HDF5 file per checkpoint holding every parameter and
// AdamW moment as a full logical float32 dataset (/model/<name>,
// /optim/adam_m/<name>, /optim/adam_v/<name>, GPT-2's names), an xxHash64
// checksum per dataset (attribute "xxh64"), and the run's state as root
// attributes. Written collectively through parallel HDF5; read back by any
// layout, each rank reading only the tensors it holds.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/gpt_config.hpp"

namespace mpiformer {

// 2: the run id and a checksum of the root metadata; 3: the tensor-parallel
// width that wrote it (the tensors are the same logical ones); 4: fp16's
// dynamic loss scaler; 5: the model family and Llama's shape (a file
// before it holds GPT-2); 6: a Mixture of Experts' shape (a file before it
// holds a dense model); 7: the data blend's record (a file before it
// holds one source at its sample position). Versions 1 to 6 are still read
// (without what they lack).
constexpr int64_t kCheckpointFormatVersion = 8;

// The run's state, stored as root attributes.
struct CheckpointMeta {
  int64_t format_version = kCheckpointFormatVersion;
  int64_t step = 0;             // optimizer steps done
  int64_t tokens_seen = 0;
  int64_t sample_position = 0;  // global data cursor: samples consumed
  int64_t epoch = 0;            // sample_position / windows per epoch
  int64_t seed = 0;             // with the cursor, fixes the sample order
  int64_t dp = 1, pp = 1, world_size = 1;  // the layout that wrote it
  int64_t tp = 1;
  // Context parallelism's ranks per data replica (format 8; 1 before):
  // dp counts the data replicas, dp x cp the stage's.
  int64_t cp = 1;
  // fp16's dynamic loss scaler (train/loss_scaler.hpp), for an exact
  // resume: 1 when the run had one, the scale's base-2 exponent (a dynamic
  // scale is always a power of two) and the steps since its last change.
  int64_t loss_scaler = 0, loss_scale_log2 = 0, loss_scale_good_steps = 0;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0, vocab_size = 0;
  // The family (0 GPT-2, 1 Llama) and Llama's shape (core/gpt_config.hpp).
  int64_t family = 0, n_kv_head = 0, ffn_hidden = 0, tie_embeddings = 1;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  // A Mixture of Experts' shape and router (experts 0: dense).
  int64_t experts = 0, top_k = 2, moe_every = 1;
  double capacity_factor = 1.25, aux_loss = 0.01, router_z_loss = 0.0;
  std::string tokenizer;        // of the training data
  std::string deck;             // the resolved input deck, TOML
  // The training sources and where each stood (train/blend_record.hpp).
  std::string data_blend;
  // The run that wrote it: a new id for each fresh run, kept across
  // resumes, so a run never prunes or is outranked by another's files.
  std::string run_id;
};

// A new run id: the UTC start time and 32 random bits.
std::string new_run_id();

// The model shape recorded in / read from the root attributes.
void set_model_config(CheckpointMeta& meta, const GptConfig& cfg);
GptConfig model_config(const CheckpointMeta& meta);

// A block of a dataset: rows [row, row + rows) of dimension 0 and, for a
// matrix, columns [col, col + cols) of dimension 1.
struct DatasetBox {
  int64_t row = 0, rows = 0, col = 0, cols = 0;
};

// What one rank contributes to one dataset. Every rank lists every dataset,
// in the same order: creation is collective.
struct DatasetSlice {
  std::string name;             // "/model/wte"
  std::vector<int64_t> shape;   // logical shape
  // The blocks this rank writes (none, one, or a tensor slice's several),
  // in increasing rows, over the same columns: their elements follow each
  // other at `data`, each block row-major.
  std::vector<DatasetBox> boxes;
  const float* data = nullptr;
  bool reports_checksum = false;  // exactly one rank per dataset
  uint64_t checksum = 0;        // xxh64 of the whole tensor, on that rank
  // Called once this rank's blocks are written (where set: offloaded
  // state's views drop the pages).
  std::function<void()> written;
};

uint64_t tensor_checksum(const float* data, int64_t n);
// InputError (path, name) unless data[n] has checksum `stored`.
void check_tensor_checksum(const std::string& path, const std::string& name, uint64_t stored,
                           const float* data, int64_t n);

// True when `path` is an HDF5 file with a /model group (not a token dataset).
bool is_checkpoint(const std::string& path);

// A write that failed (a full or failing file system): thrown on every rank
// of the write with the same message, after the partial file is removed.
class CheckpointWriteError : public SystemError {
 public:
  using SystemError::SystemError;
};

// The file was written but does not read back as the run wrote it (a
// failing disk, a stray writer): kept aside, never published.
class CheckpointVerifyError : public StorageError {
 public:
  using StorageError::StorageError;
};

// Collective over `comm`: writes `path` + ".tmp", flushes and closes it,
// reads it back, then renames it to `path` (rank 0). Nothing named `path`
// exists until it is complete and verified. The ranks agree after every
// dataset whether its write worked; if not, every rank stops there, the
// partial file is removed and every rank throws the same
// CheckpointWriteError. Then every rank reads back, from the disk, the
// blocks it wrote and compares their hashes with those of what it handed
// over (the live state, never a file opened again); if any differs, the
// file is kept as `path` + ".unverified" and every rank throws the same
// CheckpointVerifyError. Returns the seconds the read-back took.
double write_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointMeta& meta,
                        const std::vector<DatasetSlice>& datasets);

// The same file written in three parts, so that the tensors' bytes can go
// to disk while training goes on ([checkpoint] async):
//  1. lay_out_checkpoint (collective, HDF5): path.tmp made as
//     write_checkpoint makes it, every dataset allocated in one contiguous
//     extent (never filled) with its checksum, the root attributes written,
//     the file flushed, closed and cut to length. Nothing of the tensors is
//     written; the layout says where each dataset's bytes go.
//  2. write_blocks (one rank, neither MPI nor HDF5, so a thread may run
//     it beside training): this rank's blocks written at those offsets as
//     HDF5 stores them (little-endian float32, row-major), flushed to disk,
//     dropped from the page cache and read back against their hashes.
//  3. finish_checkpoint (collective): a failed write anywhere removes the
//     .tmp and every rank throws the same CheckpointWriteError; a read-back
//     that differs anywhere keeps it aside as path.unverified
//     (CheckpointVerifyError); otherwise it is renamed to `path`.
// A job killed before 3 leaves only path.tmp, which no resume takes.
struct CheckpointLayout {
  std::string path, tmp;
  int64_t step = 0;
  int rank = 0;
  std::vector<int64_t> offsets;  // each dataset's first byte in tmp
};
CheckpointLayout lay_out_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointMeta& meta,
                                    const std::vector<DatasetSlice>& datasets);
// A save's reads and writes go in pieces of at most this many floats (16
// MiB): a read-back holds one piece, whatever the tensor.
inline constexpr int64_t kCheckpointIoPiece = int64_t{1} << 22;
// Host memory a rank's save holds while it writes and reads back, when the
// longest run of floats it saves is `longest_run`: the read-back's piece
// and what it uses of the O_DIRECT staging buffer (block_io.hpp), each as
// long as that run, up to kCheckpointIoPiece floats.
double checkpoint_io_bytes(int64_t longest_run);

struct BlockWrite {
  std::string failure;    // "" or the first thing that failed
  bool mismatch = false;  // written, but read back differently
  double seconds = 0;     // writing, flushing and reading back
  double verify_seconds = 0;  // of which reading back
  std::vector<uint64_t> sums;  // each dataset's hash of this rank's blocks, as written
};
// `read_back` false: written and flushed only; read_back_blocks (on any
// thread, after) reads them back against the hashes taken as they were
// written, so the datasets' data may change meanwhile (their shapes and
// boxes may not).
BlockWrite write_blocks(const CheckpointLayout& layout, const std::vector<DatasetSlice>& datasets,
                        bool read_back = true);
void read_back_blocks(const CheckpointLayout& layout, const std::vector<DatasetSlice>& datasets,
                      BlockWrite& out);
void finish_checkpoint(MPI_Comm comm, const CheckpointLayout& layout, const BlockWrite& mine);

// Read-only access from one rank (no MPI): metadata and whole tensors, with
// shape and checksum checks; every problem is an InputError naming the file
// and the dataset.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointMeta& meta() const { return meta_; }
  // Reads dataset `name` of `shape` into out[numel] and verifies its checksum.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  // Reads rows [row_begin, row_end) of dimension 0 into `out` (a sharded
  // restore: the checksum covers the whole tensor, so the caller verifies
  // it once the rows are together); returns the stored checksum.
  uint64_t read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t row_begin,
                     int64_t row_end, float* out) const;
  // The same for blocks (DatasetSlice's order: one after another at `out`).
  uint64_t read_boxes(const std::string& name, const std::vector<int64_t>& shape,
                      const std::vector<DatasetBox>& boxes, float* out) const;
  // Verifies one dataset's checksum; "" when it holds, else the reason.
  std::string verify(const std::string& name, const std::vector<int64_t>& shape) const;
  // Every dataset under /model and /optim, with its shape.
  std::vector<std::pair<std::string, std::vector<int64_t>>> datasets() const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
  CheckpointMeta meta_;
};

}  // namespace mpiformer
