#include "checkpoint.hpp"
#include "block_io.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/mpi_check.hpp"
#include "core/output_file.hpp"
#include "core/test_hooks.hpp"
#include "core/format.hpp"
#include "hdf5_attributes.hpp"
#include "hdf5_handle.hpp"
#include "deck.hpp"
#include "hdf5_precheck.hpp"

namespace mpiformer {
namespace {

// Root attributes, in one table so the writer and the reader cannot drift.
struct IntAttr {
  const char* name;
  int64_t CheckpointMeta::*member;
  int64_t since = 1;  // the format version that added it
};
const IntAttr kIntAttrs[] = {
    {"format_version", &CheckpointMeta::format_version},
    {"step", &CheckpointMeta::step},
    {"tokens_seen", &CheckpointMeta::tokens_seen},
    {"sample_position", &CheckpointMeta::sample_position},
    {"epoch", &CheckpointMeta::epoch},
    {"seed", &CheckpointMeta::seed},
    {"dp", &CheckpointMeta::dp},
    {"pp", &CheckpointMeta::pp},
    {"world_size", &CheckpointMeta::world_size},
    {"n_layer", &CheckpointMeta::n_layer},
    {"n_head", &CheckpointMeta::n_head},
    {"n_embd", &CheckpointMeta::n_embd},
    {"seq_len", &CheckpointMeta::seq_len},
    {"vocab_size", &CheckpointMeta::vocab_size},
    {"tp", &CheckpointMeta::tp, 3},
    {"loss_scaler", &CheckpointMeta::loss_scaler, 4},
    {"loss_scale_log2", &CheckpointMeta::loss_scale_log2, 4},
    {"loss_scale_good_steps", &CheckpointMeta::loss_scale_good_steps, 4},
    {"family", &CheckpointMeta::family, 5},
    {"n_kv_head", &CheckpointMeta::n_kv_head, 5},
    {"ffn_hidden", &CheckpointMeta::ffn_hidden, 5},
    {"tie_embeddings", &CheckpointMeta::tie_embeddings, 5},
    {"experts", &CheckpointMeta::experts, 6},
    {"top_k", &CheckpointMeta::top_k, 6},
    {"moe_every", &CheckpointMeta::moe_every, 6},
    {"cp", &CheckpointMeta::cp, 8},
};
struct DoubleAttr {
  const char* name;
  double CheckpointMeta::*member;
  int64_t since;
};
const DoubleAttr kDoubleAttrs[] = {
    {"rope_theta", &CheckpointMeta::rope_theta, 5},
    {"norm_eps", &CheckpointMeta::norm_eps, 5},
    {"capacity_factor", &CheckpointMeta::capacity_factor, 6},
    {"aux_loss", &CheckpointMeta::aux_loss, 6},
    {"router_z_loss", &CheckpointMeta::router_z_loss, 6},
};

std::vector<hsize_t> dims_of(const std::vector<int64_t>& shape) {
  return std::vector<hsize_t>(shape.begin(), shape.end());
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every root attribute as text, in one order: what "meta_xxh64" covers, so
// an edited step or data position is found like a damaged tensor.
uint64_t meta_checksum(const CheckpointMeta& meta) {
  std::string text;
  for (const auto& a : kIntAttrs)
    if (meta.format_version >= a.since)
      text += std::string(a.name) + "=" + std::to_string(meta.*(a.member)) + "\n";
  for (const auto& a : kDoubleAttrs)
    if (meta.format_version >= a.since) text += strprintf("%s=%.17g\n", a.name, meta.*(a.member));
  text += "tokenizer=" + meta.tokenizer + "\ndeck=" + meta.deck + "\nrun_id=" + meta.run_id + "\n";
  if (meta.format_version >= 7) text += "data_blend=" + meta.data_blend + "\n";
  return XXH64(text.data(), text.size(), 0);
}

// Selects `boxes` of a dataset of `shape` in `space` (none when empty);
// returns the elements selected.
int64_t select_boxes(hid_t space, const std::vector<int64_t>& shape,
                     const std::vector<DatasetBox>& boxes, const std::string& where) {
  int64_t count = 0;
  bool first = true;
  for (const DatasetBox& b : boxes) {
    if (b.rows <= 0) continue;
    std::vector<hsize_t> start(shape.size(), 0), n = dims_of(shape);
    start[0] = static_cast<hsize_t>(b.row);
    n[0] = static_cast<hsize_t>(b.rows);
    if (shape.size() > 1) {
      start[1] = static_cast<hsize_t>(b.col);
      n[1] = static_cast<hsize_t>(b.cols);
    }
    H5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                                 nullptr, n.data(), nullptr),
             where);
    first = false;
    int64_t e = 1;
    for (hsize_t x : n) e *= static_cast<int64_t>(x);
    count += e;
  }
  if (first) H5_CHECK(H5Sselect_none(space), where);
  return count;
}

// The family's attributes: values the model can be built from.
void check_family(const CheckpointMeta& m, const std::string& path) {
  if (m.family != 0 && m.family != 1)
    throw InputError(path, "attribute family", "expected 0 (GPT-2) or 1 (Llama)");
  if (m.tie_embeddings != 0 && m.tie_embeddings != 1)
    throw InputError(path, "attribute tie_embeddings", "expected 0 or 1");
  if (m.family == 0 && (m.n_kv_head != 0 || m.ffn_hidden != 0 || m.tie_embeddings != 1))
    throw InputError(path, "attribute family", "GPT-2 with Llama's attributes set");
  if (m.family == 1 && (m.n_kv_head < 1 || m.n_head % m.n_kv_head != 0 || m.ffn_hidden < 1))
    throw InputError(path, "attribute n_kv_head",
                     "a Llama model needs n_kv_head dividing n_head and ffn_hidden >= 1");
  if (!(m.rope_theta >= 1) || !(m.norm_eps > 0 && m.norm_eps <= 1))
    throw InputError(path, "attribute rope_theta", "rope_theta >= 1 and norm_eps in (0, 1] expected");
  // A Mixture of Experts (comparisons only: check_model_limits bounds the
  // sizes next, before anything is sized from them).
  if (m.experts < 0 || (m.experts > 0 && (m.top_k < 1 || m.top_k > m.experts || m.moe_every < 1)))
    throw InputError(path, "attribute experts",
                     "experts >= 0, and with experts: 1 <= top_k <= experts and moe_every >= 1 expected");
  if (!(m.capacity_factor >= 0) || !(m.aux_loss >= 0) || !(m.router_z_loss >= 0) ||
      !std::isfinite(m.capacity_factor + m.aux_loss + m.router_z_loss))
    throw InputError(path, "attribute capacity_factor",
                     "capacity_factor, aux_loss and router_z_loss: finite and >= 0 expected");
}

}  // namespace

std::string new_run_id() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  return strprintf("%s-%08x", stamp, static_cast<unsigned>(std::random_device{}()));
}

void set_model_config(CheckpointMeta& meta, const GptConfig& cfg) {
  meta.n_layer = cfg.n_layer;
  meta.n_head = cfg.n_head;
  meta.n_embd = cfg.n_embd;
  meta.seq_len = cfg.seq_len;
  meta.vocab_size = cfg.vocab_size;
  meta.family = cfg.llama() ? 1 : 0;
  meta.n_kv_head = cfg.n_kv_head;
  meta.ffn_hidden = cfg.ffn_hidden;
  meta.tie_embeddings = cfg.tie_embeddings ? 1 : 0;
  meta.rope_theta = cfg.rope_theta;
  meta.norm_eps = cfg.norm_eps;
  meta.experts = cfg.experts;
  meta.top_k = cfg.top_k;
  meta.moe_every = cfg.moe_every;
  meta.capacity_factor = cfg.capacity_factor;
  meta.aux_loss = cfg.aux_loss;
  meta.router_z_loss = cfg.router_z_loss;
}

GptConfig model_config(const CheckpointMeta& meta) {
  GptConfig cfg;
  cfg.n_layer = meta.n_layer;
  cfg.n_head = meta.n_head;
  cfg.n_embd = meta.n_embd;
  cfg.seq_len = meta.seq_len;
  cfg.vocab_size = meta.vocab_size;
  cfg.family = meta.family == 1 ? ModelFamily::kLlama : ModelFamily::kGpt2;
  cfg.n_kv_head = meta.n_kv_head;
  cfg.ffn_hidden = meta.ffn_hidden;
  cfg.tie_embeddings = meta.tie_embeddings != 0;
  cfg.rope_theta = meta.rope_theta;
  cfg.norm_eps = meta.norm_eps;
  cfg.experts = meta.experts;
  cfg.top_k = meta.top_k;
  cfg.moe_every = meta.moe_every;
  cfg.capacity_factor = meta.capacity_factor;
  cfg.aux_loss = meta.aux_loss;
  cfg.router_z_loss = meta.router_z_loss;
  return cfg;
}

bool is_checkpoint(const std::string& path) {
  H5QuietErrors quiet;
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  precheck_hdf5(path);
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  return f.valid() && H5Lexists(f.get(), "model", H5P_DEFAULT) > 0;
}

namespace {
// Allocates `bytes` of disk for `path` (0, or the errno). A file system that
// cannot reserve (EOPNOTSUPP: some network file systems) is not an error:
// the save goes on as before, unreserved.
int reserve_space(const std::string& path, int64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  return rc == EOPNOTSUPP ? 0 : rc;
}
}  // namespace

double checkpoint_io_bytes(int64_t longest_run) {
  const double piece =
      static_cast<double>(std::min(kCheckpointIoPiece, std::max<int64_t>(0, longest_run))) *
      sizeof(float);
  return piece + std::min(piece, static_cast<double>(BlockIo::kStagingBytes));
}

uint64_t tensor_checksum(const float* data, int64_t n) {
  return XXH64(data, static_cast<size_t>(n) * sizeof(float), 0);
}

namespace {

}  // namespace

namespace {

// Collective: `tmp` created for parallel writes over `comm` (rank 0 made
// it afresh first, so a link in its place is never written through).
H5Handle create_parallel_file(MPI_Comm comm, const std::string& tmp) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), tmp);
  use_checksummed_format(fapl.get(), tmp);
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl.get(), 1), tmp);
  H5_CHECK(H5Pset_coll_metadata_write(fapl.get(), 1), tmp);
  H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.valid()) throw InputError(tmp, "[checkpoint] dir", "cannot create (is it writable?)");
  return file;
}

// The bytes reserved for a file of `datasets`: the tensors, and generous
// slack for HDF5's headers (cut off once the file is closed).
int64_t reserved_bytes(const CheckpointMeta& meta, const std::vector<DatasetSlice>& datasets) {
  int64_t bytes = (1 << 20) + static_cast<int64_t>(meta.deck.size());
  for (const auto& d : datasets) bytes += 4 * numel(d.shape) + (16 << 10);
  return bytes;
}

// Collective: the groups of `datasets` (/model, /optim/adam_m, ...), in
// one order on every rank, keeping their links compact.
void create_groups(hid_t file, const std::vector<DatasetSlice>& datasets, hid_t lcpl,
                   const std::string& tmp) {
  H5Handle gcpl = compact_group_properties(tmp);
  std::vector<std::string> groups;
  for (const auto& d : datasets) {
    const std::string g = d.name.substr(0, d.name.rfind('/'));
    if (!g.empty() && std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  for (const auto& g : groups) {
    H5Handle made(H5Gcreate2(file, g.c_str(), lcpl, gcpl.get(), H5P_DEFAULT), H5Gclose);
    H5_CHECK(made.get(), tmp + ": " + g);
  }
}

// Collective: the root attributes, and their checksum.
void write_root_attributes(hid_t file, const CheckpointMeta& meta, const std::string& tmp) {
  for (const auto& a : kIntAttrs) write_int_attr(file, a.name, meta.*(a.member), tmp);
  for (const auto& a : kDoubleAttrs) write_double_attr(file, a.name, meta.*(a.member), tmp);
  write_string_attr(file, "tokenizer", meta.tokenizer, tmp);
  write_string_attr(file, "deck", meta.deck, tmp);
  write_string_attr(file, "run_id", meta.run_id, tmp);
  write_string_attr(file, "data_blend", meta.data_blend, tmp);
  write_u64_attr(file, "meta_xxh64", meta_checksum(meta), tmp);
}

// Every dataset's checksum, from the one rank that holds it: attribute
// writes are collective, so every rank needs them all.
std::vector<uint64_t> agreed_checksums(MPI_Comm comm, const std::vector<DatasetSlice>& datasets) {
  std::vector<uint64_t> sums(datasets.size(), 0);
  for (size_t i = 0; i < datasets.size(); ++i)
    if (datasets[i].reports_checksum) sums[i] = datasets[i].checksum;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T,
                          MPI_SUM, comm));
  return sums;
}

// Rank 0, once the file is closed: the reservation's unused tail cut
// (HDF5 extends a file, never shrinks it). "" or what failed.
std::string cut_to_hdf5_length(const std::string& tmp) {
  try {
    const uint64_t end = hdf5_end_of_file(tmp);
    if (::truncate(tmp.c_str(), static_cast<off_t>(end)) != 0)
      return "cannot cut " + tmp + " to its HDF5 length: " + std::strerror(errno);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// Collective, once every rank read its part back (`mismatch`: this rank's
// first difference, or ""): the file gets its name only if all of it
// agrees; otherwise it is kept as path.unverified and every rank throws
// the same CheckpointVerifyError.
void name_if_verified(MPI_Comm comm, const std::string& path, const std::string& mine) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const std::string tmp = path + ".tmp";
  const std::string mismatch = lowest_rank_message(comm, mine);
  if (!mismatch.empty()) {
    const std::string aside = path + ".unverified";
    if (rank == 0) {
      try {
        durable_rename(tmp, aside);
      } catch (const std::exception&) {  // the message below says what matters
      }
    }
    MPI_CHECK(MPI_Barrier(comm));
    throw CheckpointVerifyError(path + ": the checkpoint did not read back as written (" +
                                mismatch + "); it was kept as " + aside +
                                " and not published, and no older checkpoint was removed");
  }
  std::string failure;
  if (rank == 0) {
    try {
      durable_rename(tmp, path);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  int ok = failure.empty() ? 1 : 0;
  MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, comm));
  if (!ok) throw SystemError(rank == 0 ? failure : "cannot publish " + path + " (see rank 0)");
}

}  // namespace



CheckpointLayout lay_out_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointMeta& meta,
                                    const std::vector<DatasetSlice>& datasets) {
  CheckpointLayout layout;
  layout.path = path;
  layout.tmp = path + ".tmp";
  layout.step = meta.step;
  layout.offsets.assign(datasets.size(), 0);
  MPI_CHECK(MPI_Comm_rank(comm, &layout.rank));
  const std::string& tmp = layout.tmp;
  const std::vector<uint64_t> sums = agreed_checksums(comm, datasets);
  std::string failure;
  const auto agree = [&] {
    failure = lowest_rank_message(comm, failure, false);
    return !failure.empty();
  };
  if (layout.rank == 0) {
    try {
      ::close(open_output(tmp, OutputMode::kReplace, "[checkpoint] dir"));
    } catch (const InputError& e) {
      failure = e.what();
    }
  }
  if (agree()) throw CheckpointWriteError(failure);
  {
    H5QuietErrors quiet;
    H5Handle file = create_parallel_file(comm, tmp);
    if (layout.rank == 0) {
      const int64_t bytes = reserved_bytes(meta, datasets);
      if (const int e = reserve_space(tmp, bytes); e != 0)
        failure = strprintf("reserving %.1f MB for the file: %s", static_cast<double>(bytes) / 1e6,
                            std::strerror(e));
    }
    H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1), tmp);
    create_groups(file.get(), datasets, lcpl.get(), tmp);
    // One extent per dataset, allocated now and never filled: its bytes
    // are written later, outside HDF5, where the offset says.
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), tmp);
    H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), tmp);
    H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), tmp);
    if (!agree()) {
      for (size_t i = 0; i < datasets.size(); ++i) {
        const DatasetSlice& d = datasets[i];
        const auto dims = dims_of(d.shape);
        H5Handle fspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
        H5Handle dset(H5Dcreate2(file.get(), d.name.c_str(), H5T_IEEE_F32LE, fspace.get(), lcpl.get(),
                                 dcpl.get(), H5P_DEFAULT),
                      H5Dclose);
        H5_CHECK(dset.get(), tmp + ": " + d.name);
        const haddr_t at = H5Dget_offset(dset.get());
        if (at == HADDR_UNDEF) throw SystemError(tmp + ": " + d.name + ": no contiguous extent");
        layout.offsets[i] = static_cast<int64_t>(at);
        write_u64_attr(dset.get(), "xxh64", sums[i], tmp);
      }
      write_root_attributes(file.get(), meta, tmp);
      errno = 0;
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
        failure = std::string("flushing the file's metadata: ") + std::strerror(errno);
      agree();
    }
  }  // closed, collectively, here
  MPI_CHECK(MPI_Barrier(comm));
  if (failure.empty() && layout.rank == 0) failure = cut_to_hdf5_length(tmp);
  if (agree()) {
    if (layout.rank == 0) std::remove(tmp.c_str());
    MPI_CHECK(MPI_Barrier(comm));
    throw CheckpointWriteError(tmp + ": " + failure + " (the partial file was removed)");
  }
  return layout;
}

namespace {

// Each run of contiguous bytes of this rank's blocks of `d` (a dataset at
// `base`): f(file offset, elements, index of its first element in d.data).
template <class F>
void for_each_run(const DatasetSlice& d, int64_t base, F f) {
  const int64_t width = d.shape.size() > 1 ? d.shape[1] : 1;
  int64_t at = 0;
  for (const DatasetBox& b : d.boxes) {
    if (b.rows <= 0) continue;
    const int64_t cols = d.shape.size() > 1 ? b.cols : 1, col = d.shape.size() > 1 ? b.col : 0;
    if (cols == width) {  // whole rows: one run
      f(base + 4 * b.row * width, b.rows * width, at);
      at += b.rows * width;
      continue;
    }
    for (int64_t r = b.row; r < b.row + b.rows; ++r, at += cols) f(base + 4 * (r * width + col), cols, at);
  }
}

// A streaming XXH64 (its state is opaque in the shared library's header).
using HashState = std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)>;
HashState hash_state() {
  HashState h(XXH64_createState(), XXH64_freeState);
  if (!h) throw std::bad_alloc();
  return h;
}

// for_each_run's runs cut into pieces of at most kCheckpointIoPiece
// floats, so a read-back's buffer is one piece, whatever the tensor.
template <class F>
void for_each_piece(const DatasetSlice& d, int64_t base, F f) {
  for_each_run(d, base, [&](int64_t offset, int64_t n, int64_t first) {
    for (int64_t at = 0; at < n; at += kCheckpointIoPiece)
      f(offset + 4 * at, std::min(kCheckpointIoPiece, n - at), first + at);
  });
}

}  // namespace

BlockWrite write_blocks(const CheckpointLayout& layout, const std::vector<DatasetSlice>& datasets,
                        bool read_back) {
  static_assert(sizeof(float) == 4, "HDF5's H5T_IEEE_F32LE");
  const auto t0 = std::chrono::steady_clock::now();
  BlockWrite out;
  const auto finish = [&] {
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  const int fd = ::open(layout.tmp.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    out.failure = "opening " + layout.tmp + ": " + std::strerror(errno);
    return finish();
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_it{fd};
  // Released before the read-back makes its own: one staging buffer at a
  // time (checkpoint_io_bytes).
  auto io = std::make_unique<BlockIo>(layout.tmp, fd);
  const int64_t fault = test_hooks::checkpoint_fault_after();
  if (const int64_t slow = test_hooks::slow_background_write_ms(); slow > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(slow));
  // Each dataset's hash of what this rank hands over, taken as it goes to
  // disk: the read-back compares against these, never the live state
  // again (which a read-back behind training would find changed).
  out.sums.assign(datasets.size(), 0);
  const HashState sum = hash_state();
  for (size_t i = 0; i < datasets.size() && out.failure.empty(); ++i) {
    const DatasetSlice& d = datasets[i];
    int64_t count = 0;
    // Hashed piece by piece right after each piece is written, while its
    // bytes are still in cache (the runs come in element order: the hash
    // is tensor_checksum of the whole).
    XXH64_reset(sum.get(), 0);
    for_each_piece(d, layout.offsets[i], [&](int64_t offset, int64_t n, int64_t first) {
      count += n;
      if (!out.failure.empty()) return;
      errno = 0;
      const char* bytes = reinterpret_cast<const char*>(d.data + first);
      if (!io->write(bytes, static_cast<size_t>(4 * n), offset))
        out.failure = "writing " + d.name + ": " + (errno != 0 ? std::strerror(errno) : "failed");
      XXH64_update(sum.get(), bytes, static_cast<size_t>(4 * n));
    });
    if (count > 0) out.sums[i] = XXH64_digest(sum.get());
    if (d.written) d.written();
    if (fault >= 0 && static_cast<int64_t>(i) + 1 >= fault) {
      // The node dies in the middle of a background write.
      std::fprintf(stderr, "mpiformer: fault injected after %lld datasets of %s\n",
                   static_cast<long long>(i + 1), layout.tmp.c_str());
      std::fflush(stderr);
      ::kill(::getpid(), SIGKILL);
    }
  }
  if (out.failure.empty() && ::fsync(fd) != 0)
    out.failure = std::string("flushing ") + layout.tmp + ": " + std::strerror(errno);
  io.reset();
  if (!out.failure.empty()) return finish();
  if (layout.rank == 0 && layout.step == test_hooks::fault_corrupt_checkpoint() && !datasets.empty()) {
    float v = 0;  // one value changed in place, as a stray writer would
    if (pread_whole(fd, reinterpret_cast<char*>(&v), 4, layout.offsets[0])) {
      v += 1.0f;
      pwrite_whole(fd, reinterpret_cast<const char*>(&v), 4, layout.offsets[0]);
      ::fsync(fd);
    }
  }
  finish();
  if (read_back) read_back_blocks(layout, datasets, out);
  return out;
}

void read_back_blocks(const CheckpointLayout& layout, const std::vector<DatasetSlice>& datasets,
                      BlockWrite& out) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Account {
    BlockWrite& out;
    std::chrono::steady_clock::time_point t0;
    ~Account() {
      out.verify_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.seconds += out.verify_seconds;
    }
  } account{out, t0};
  if (!out.failure.empty()) return;
  const int fd = ::open(layout.tmp.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    out.failure = "opening " + layout.tmp + " to read it back: " + std::strerror(errno);
    return;
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_it{fd};
  BlockIo io(layout.tmp, fd);
  // What reads back next comes from the disk, not the page cache (the
  // direct reads by construction; the partial blocks once dropped).
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  // One piece at a time, hashed as it comes, into a buffer as long as the
  // longest piece (checkpoint_io_bytes): a small model's save does not hold
  // a whole 16 MiB piece.
  int64_t longest = 0;
  for (size_t i = 0; i < datasets.size(); ++i)
    for_each_piece(datasets[i], layout.offsets[i],
                   [&](int64_t, int64_t n, int64_t) { longest = std::max(longest, n); });
  std::vector<float> back(static_cast<size_t>(longest));
  const HashState sum = hash_state();
  for (size_t i = 0; i < datasets.size() && out.failure.empty(); ++i) {
    const DatasetSlice& d = datasets[i];
    int64_t count = 0;
    XXH64_reset(sum.get(), 0);
    for_each_piece(d, layout.offsets[i], [&](int64_t offset, int64_t n, int64_t) {
      count += n;
      if (!out.failure.empty()) return;
      if (!io.read(reinterpret_cast<char*>(back.data()), static_cast<size_t>(4 * n), offset))
        out.failure = "reading back " + d.name + ": " + (errno != 0 ? std::strerror(errno) : "short");
      XXH64_update(sum.get(), back.data(), static_cast<size_t>(4 * n));
    });
    if (count == 0) continue;
    if (out.failure.empty() && XXH64_digest(sum.get()) != out.sums[i]) {
      out.failure = d.name + " reads back differently from what the run wrote";
      out.mismatch = true;
    }
  }
}

void finish_checkpoint(MPI_Comm comm, const CheckpointLayout& layout, const BlockWrite& mine) {
  const std::string failure = lowest_rank_message(comm, mine.mismatch ? "" : mine.failure, false);
  if (!failure.empty()) {
    if (layout.rank == 0) std::remove(layout.tmp.c_str());
    MPI_CHECK(MPI_Barrier(comm));
    throw CheckpointWriteError(layout.tmp + ": " + failure + " (the partial file was removed)");
  }
  // Every rank's bytes are on disk: rank 0 also opens the file as a resume
  // would (its root attributes and their checksum, through HDF5).
  std::string mismatch = mine.mismatch ? mine.failure : "";
  if (layout.rank == 0 && mismatch.empty()) {
    try {
      const CheckpointReader reader(layout.tmp);
    } catch (const std::exception& e) {
      mismatch = std::string("it does not read back: ") + e.what();
    }
  }
  name_if_verified(comm, layout.path, mismatch);
}

double write_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointMeta& meta,
                        const std::vector<DatasetSlice>& datasets) {
  const CheckpointLayout layout = lay_out_checkpoint(comm, path, meta, datasets);
  const BlockWrite mine = write_blocks(layout, datasets);
  finish_checkpoint(comm, layout, mine);
  return mine.verify_seconds;
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  H5QuietErrors quiet;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path, "", "does not exist");
  precheck_hdf5(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw InputError(path, "", "not a readable HDF5 checkpoint (missing, truncated or damaged)");
  }
  // Owned by a handle until every check has passed: a constructor that
  // throws runs no destructor, and automatic resume goes on to try older
  // checkpoints in the same process after a bad one.
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw InputError(path, "", "cannot open (truncated or damaged?)");
  file_ = file.get();
  meta_.format_version = read_int_attr(file_, "format_version", path);
  if (meta_.format_version < 1 || meta_.format_version > kCheckpointFormatVersion) {
    throw InputError(path, "attribute format_version",
                     strprintf("this build reads versions 1 to %lld, the file is version %lld",
                               static_cast<long long>(kCheckpointFormatVersion),
                               static_cast<long long>(meta_.format_version)));
  }
  for (const auto& a : kIntAttrs)
    if (meta_.format_version >= a.since) meta_.*(a.member) = read_int_attr(file_, a.name, path);
  for (const auto& a : kDoubleAttrs)
    if (meta_.format_version >= a.since) meta_.*(a.member) = read_double_attr(file_, a.name, path);
  check_family(meta_, path);
  // Before anything is sized from them (version 1 has no checksum over
  // them, and any version's can be edited).
  check_model_limits(model_config(meta_), path, "attribute ");
  // fp16 scales stay within [2^-24, 2^127] (float's range); a tracker is a
  // count of steps.
  if (meta_.loss_scaler != 0 && meta_.loss_scaler != 1)
    throw InputError(path, "attribute loss_scaler", "expected 0 or 1");
  if (meta_.loss_scale_log2 < -24 || meta_.loss_scale_log2 > 127)
    throw InputError(path, "attribute loss_scale_log2", "expected an exponent in [-24, 127]");
  if (meta_.loss_scale_good_steps < 0)
    throw InputError(path, "attribute loss_scale_good_steps", "expected a count >= 0");
  // The layout that wrote it, within the deck's limits (a reader
  // multiplies them).
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"dp", meta_.dp}, {"pp", meta_.pp},
                                    {"tp", meta_.tp}, {"cp", meta_.cp}}) {
    if (value < 1 || value > (int64_t{1} << 20))
      throw InputError(path, std::string("attribute ") + name,
                       strprintf("expected a rank count in [1, 2^20], got %lld",
                                 static_cast<long long>(value)));
  }
  meta_.tokenizer = read_string_attr(file_, "tokenizer", path);
  meta_.deck = read_string_attr(file_, "deck", path);
  if (meta_.format_version >= 2) {
    meta_.run_id = read_string_attr(file_, "run_id", path);
    if (meta_.format_version >= 7) meta_.data_blend = read_string_attr(file_, "data_blend", path);
    const uint64_t want = read_u64_attr(file_, "meta_xxh64", path);
    if (const uint64_t got = meta_checksum(meta_); got != want) {
      throw InputError(path, "root attributes",
                       strprintf("checksum mismatch (stored %016llx, attributes %016llx): the "
                                 "step, data position or deck were edited or damaged",
                                 static_cast<unsigned long long>(want),
                                 static_cast<unsigned long long>(got)));
    }
  }
  file.release();
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(file_);
}

uint64_t CheckpointReader::read_rows(const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t row_begin, int64_t row_end, float* out) const {
  const int64_t width = shape.size() > 1 ? shape[1] : 1;
  return read_boxes(name, shape, {DatasetBox{row_begin, row_end - row_begin, 0, width}}, out);
}

uint64_t CheckpointReader::read_boxes(const std::string& name, const std::vector<int64_t>& shape,
                                      const std::vector<DatasetBox>& boxes, float* out) const {
  H5QuietErrors quiet;
  const H5Handle dset = open_own_dataset(file_, path_, name);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (dims != dims_of(shape)) {
    auto show = [](const auto& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    throw InputError(path_, name, "shape " + show(dims) + ", the deck's model needs " + show(shape));
  }
  require_stored(dset.get(), path_, name);
  const uint64_t stored = read_u64_attr(dset.get(), "xxh64", path_ + ": " + name);
  const int64_t count = select_boxes(space.get(), shape, boxes, path_ + ": " + name);
  if (count == 0) return stored;
  const hsize_t mcount[1] = {static_cast<hsize_t>(count)};
  H5Handle memory(H5Screate_simple(1, mcount, nullptr), H5Sclose);
  if (H5Dread(dset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, out) < 0) {
    throw InputError(path_, name, "read failed (truncated or damaged file)");
  }
  return stored;
}

namespace {
std::string checksum_mismatch(uint64_t stored, uint64_t got) {
  return strprintf("checksum mismatch (stored %016llx, data %016llx): the file is damaged",
                   static_cast<unsigned long long>(stored), static_cast<unsigned long long>(got));
}
}  // namespace

void check_tensor_checksum(const std::string& path, const std::string& name, uint64_t stored,
                           const float* data, int64_t n) {
  const uint64_t got = tensor_checksum(data, n);
  if (got != stored) throw InputError(path, name, checksum_mismatch(stored, got));
}

void CheckpointReader::read(const std::string& name, const std::vector<int64_t>& shape,
                            float* out) const {
  const uint64_t stored = read_rows(name, shape, 0, shape.empty() ? 1 : shape[0], out);
  check_tensor_checksum(path_, name, stored, out, numel(shape));
}

std::string CheckpointReader::verify(const std::string& name,
                                     const std::vector<int64_t>& shape) const {
  // In blocks of rows of at most 16 MB, the checksum taken as they come:
  // memory stays bounded whatever shape the file's attributes claim (each
  // read first checks the dataset has that shape).
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t width = rows > 0 ? numel(shape) / rows : 0;
  const int64_t block = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(width, 1));
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state(XXH64_createState(),
                                                                          XXH64_freeState);
  XXH64_reset(state.get(), 0);
  uint64_t stored = 0;
  std::vector<float> data;
  try {
    for (int64_t r = 0; r < rows; r += block) {
      const int64_t n = std::min(block, rows - r);
      data.resize(static_cast<size_t>(n * width));
      stored = read_rows(name, shape, r, r + n, data.data());
      XXH64_update(state.get(), data.data(), data.size() * sizeof(float));
    }
  } catch (const InputError& e) {
    return e.reason();
  }
  const uint64_t got = XXH64_digest(state.get());
  return got != stored ? checksum_mismatch(stored, got) : "";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> CheckpointReader::datasets() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  struct Ctx {
    std::vector<std::pair<std::string, std::vector<int64_t>>>* out;
  } ctx{&out};
  auto visit = [](hid_t obj, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    H5Handle d(H5Dopen2(obj, name, H5P_DEFAULT), H5Dclose);
    H5Handle s(H5Dget_space(d.get()), H5Sclose);
    const int nd = H5Sget_simple_extent_ndims(s.get());
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
    H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
    static_cast<Ctx*>(data)->out->emplace_back("/" + std::string(name),
                                               std::vector<int64_t>(dims.begin(), dims.end()));
    return 0;
  };
  H5Ovisit(file_, H5_INDEX_NAME, H5_ITER_INC, visit, &ctx);
  return out;
}

}  // namespace mpiformer
