#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <filesystem>
#include <utility>
#include <vector>
#include <fstream>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/output_path.hpp"
#include "core/format.hpp"
#include "core/mpi_check.hpp"
#include "core/output_file.hpp"
#include "parallel/input_agreement.hpp"
#include "prep_corpus.hpp"
#include "token_file_writer.hpp"
#include "megatron_dataset.hpp"
#include "token_dataset.hpp"
#include "tokenizer.hpp"

namespace mpiformer {

std::string val_output_path(const std::string& out) {
  const auto dot = out.rfind('.');
  const auto slash = out.rfind('/');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return has_ext ? out.substr(0, dot) + "_val" + out.substr(dot) : out + "_val";
}

namespace {

// Rank `rank`'s scratch file of `what` ("tokens", "documents") beside the
// output.
std::string scratch_path(const std::string& output, int rank, const char* what) {
  return output + strprintf(".rank%d.%s.tmp", rank, what);
}

// Checked before anything is read or written: prep must never replace its
// own input (with an output, its temporary name, or a rank's scratch file),
// and a fraction that is not a number passes a range check.
void check_outputs(const PrepArgs& args, int world) {
  if (!(args.val_fraction >= 0.0 && args.val_fraction <= 0.5)) {
    throw InputError("--val-fraction", "",
                     "expected a number in [0, 0.5], got " + std::to_string(args.val_fraction));
  }
  std::vector<std::pair<std::string, std::string>> outputs = {{"--output", args.output}};
  if (args.val_fraction > 0) {
    outputs.emplace_back("the validation split (--val-fraction)", val_output_path(args.output));
  }
  if (args.format == "megatron") {
    // Each output is a .bin and an .idx.
    for (size_t i = 0, n = outputs.size(); i < n; ++i) {
      const std::string& out = outputs[i].second;
      const bool bin = out.size() > 4 && out.compare(out.size() - 4, 4, ".bin") == 0;
      outputs.emplace_back(outputs[i].first, (bin ? out.substr(0, out.size() - 4) : out) + ".idx");
    }
  }
  for (size_t i = 0, n = outputs.size(); i < n; ++i)
    outputs.emplace_back(outputs[i].first + "'s temporary name", outputs[i].second + ".tmp");
  for (int r = 0; r < world; ++r)
    for (const char* what : {"tokens", "documents"})
      outputs.emplace_back("a rank's scratch file", scratch_path(args.output, r, what));
  std::vector<std::string> inputs = args.inputs;
  if (!args.tokenizer_model.empty()) inputs.push_back(args.tokenizer_model);
  for (const auto& [what, out] : outputs) {
    for (const auto& in : inputs) {
      if (same_file(out, in)) {
        throw InputError(in, "",
                         "is both an input and " + what + " (" + out +
                             "): prep would overwrite its own text; choose another --output");
      }
    }
  }
}

// A rank's tokens and document starts as it makes them: raw uint32 and
// int64 scratch files beside the output (the same file system, and never
// all in memory), removed when prep ends.
class Scratch {
 public:
  explicit Scratch(const std::string& path) : path_(path) {
    // Created afresh (a planted link refused), then opened to read too.
    ::close(open_output(path, OutputMode::kReplace, "--output"));
    const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    file_ = fd >= 0 ? ::fdopen(fd, "r+b") : nullptr;
    if (file_ == nullptr) {
      if (fd >= 0) ::close(fd);
      std::remove(path.c_str());
      throw InputError(path, "--output", "cannot open a scratch file beside the output");
    }
  }
  ~Scratch() {
    if (file_ != nullptr) std::fclose(file_);
    std::remove(path_.c_str());
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  void append(const T* v, size_t n) {
    if (std::fwrite(v, sizeof(T), n, file_) != n)
      throw InputError(path_, "--output", "writing scratch data failed (a full disk?)");
  }
  template <class T>
  void read(int64_t at, int64_t n, T* out) {
    std::fflush(file_);
    if (::pread(::fileno(file_), out, static_cast<size_t>(n) * sizeof(T),
                static_cast<off_t>(at * static_cast<int64_t>(sizeof(T)))) !=
        static_cast<ssize_t>(static_cast<size_t>(n) * sizeof(T)))
      throw InputError(path_, "--output", "reading scratch data back failed");
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// A rank's tokens in the narrowest width its vocabulary needs (a quarter
// of the scratch I/O for bytes, half for GPT-2's).
class TokenScratch {
 public:
  TokenScratch(const std::string& path, int64_t vocab_size)
      : file_(path), width_(token_bytes(vocab_size)) {}
  void append(const uint32_t* ids, size_t n) {
    if (width_ == 4) return file_.append(ids, n);
    narrow_.resize(n * static_cast<size_t>(width_));
    for (size_t i = 0; i < n; ++i) {
      if (width_ == 1) narrow_[i] = static_cast<uint8_t>(ids[i]);
      else std::memcpy(&narrow_[2 * i], &ids[i], 2);  // little-endian low half
    }
    file_.append(narrow_.data(), narrow_.size());
  }
  void read(int64_t at, int64_t n, uint32_t* out) {
    if (width_ == 4) return file_.read(at, n, out);
    wide_.resize(static_cast<size_t>(n * width_));
    file_.read(at * width_, n * width_, wide_.data());
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v = 0;
      if (width_ == 2) std::memcpy(&v, &wide_[static_cast<size_t>(2 * i)], 2);
      out[i] = width_ == 1 ? wide_[static_cast<size_t>(i)] : v;
    }
  }

 private:
  Scratch file_;
  int64_t width_;
  std::vector<uint8_t> narrow_, wide_;
};

// Units to ranks in order, each rank about an equal share of the bytes
// (a compressed file counted at 4 times its size, a typical ratio).
std::vector<std::pair<size_t, size_t>> share_units(const std::vector<PrepInput>& inputs,
                                                   const std::vector<PrepUnit>& units, int world,
                                                   std::vector<double>* weight) {
  weight->clear();
  double total = 0;
  for (const PrepUnit& u : units) {
    const PrepInput& in = inputs[static_cast<size_t>(u.input)];
    const double w = in.compression != Compression::kNone ? 4.0 * static_cast<double>(in.bytes)
                     : static_cast<double>((u.end < 0 ? in.bytes : u.end) - u.begin);
    weight->push_back(w);
    total += w;
  }
  std::vector<std::pair<size_t, size_t>> ranges(static_cast<size_t>(world));
  size_t next = 0;
  double done = 0;
  for (int r = 0; r < world; ++r) {
    const size_t first = next;
    const double goal = total * static_cast<double>(r + 1) / world;
    while (next < units.size() && (r == world - 1 || done + (*weight)[next] / 2 <= goal))
      done += (*weight)[next++];
    ranges[static_cast<size_t>(r)] = {first, next};
  }
  return ranges;
}

// Rank 0's line every 10 s: its own share's progress stands for the whole
// (the shares are equal in bytes).
class PrepProgress {
 public:
  PrepProgress(int rank, double share_bytes, double total_bytes)
      : lead_(rank == 0), share_(share_bytes), total_(total_bytes), t0_(Clock::now()), last_(t0_) {}
  void add(int64_t bytes, int64_t tokens) {
    done_ += static_cast<double>(bytes);
    tokens_ = tokens;
    const auto now = Clock::now();
    if (!lead_ || std::chrono::duration<double>(now - last_).count() < 10) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count();
    const double f = share_ > 0 ? std::min(1.0, done_ / share_) : 1.0, rate = done_ / s;
    const double eta = rate > 0 ? (share_ - done_) / rate : 0;
    std::fprintf(stderr,
                 "prep: %.0f%% of %.1f MB (rank 0's share: %.1f of %.1f MB), %.2f M tokens on "
                 "rank 0, %.2f MB/s per rank, ETA %d:%02d\n",
                 100 * f, total_ / 1e6, done_ / 1e6, share_ / 1e6, static_cast<double>(tokens_) / 1e6,
                 rate / 1e6, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool lead_;
  double share_, total_, done_ = 0;
  int64_t tokens_ = 0;
  Clock::time_point t0_, last_;
};

int64_t exscan_sum(int64_t mine) {
  int64_t before = 0;
  MPI_CHECK(MPI_Exscan(&mine, &before, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank == 0 ? 0 : before;
}

int64_t allreduce(int64_t v, MPI_Op op) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, op, MPI_COMM_WORLD));
  return v;
}

}  // namespace

int run_prep(const PrepArgs& args, int rank) {
  int world = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tok;
  std::vector<PrepInput> inputs;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    check_outputs(args, world);
    if (!args.tokenizer_model.empty() && args.tokenizer != "sentencepiece")
      throw InputError(args.tokenizer_model, "--tokenizer-model",
                       "applies to --tokenizer sentencepiece only (this is " + args.tokenizer + ")");
    if (args.format == "megatron" && world > 1)
      throw InputError("--format", "megatron",
                       strprintf("is written by one rank (its index is built in memory); run prep "
                                 "with one rank, not %d, or write HDF5", world));
    tok = make_tokenizer(args.tokenizer,
                         args.vocab_dir.empty() ? default_gpt2_vocab_dir() : args.vocab_dir,
                         args.tokenizer_model);
    for (const auto& path : args.inputs) inputs.push_back(describe_input(path));
  });
  // Ranks split the inputs by their sizes: every rank must see the same
  // files (a node-local copy rewritten between launches would lose or
  // repeat text).
  for (const PrepInput& in : inputs)
    agree_on_view(MPI_COMM_WORLD,
                  strprintf("%lld bytes, %s", static_cast<long long>(in.bytes),
                            in.compression == Compression::kGzip   ? "gzip"
                            : in.compression == Compression::kZstd ? "zstd"
                                                                   : "plain"),
                  in.path, "size");
  // The units: rank 0 reads around the cuts, every rank gets its list.
  double total_bytes = 0;
  for (const PrepInput& in : inputs) total_bytes += static_cast<double>(in.bytes);
  const auto target = static_cast<int64_t>(
      std::clamp(total_bytes / (4.0 * world), double{1 << 20}, double{int64_t{256} << 20}));
  std::vector<int64_t> flat;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    for (const PrepUnit& u : plan_units(inputs, *tok, target)) flat.insert(flat.end(), {u.input, u.begin, u.end});
  });
  int64_t n_flat = static_cast<int64_t>(flat.size());
  MPI_CHECK(MPI_Bcast(&n_flat, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  flat.resize(static_cast<size_t>(n_flat));
  MPI_CHECK(MPI_Bcast(flat.data(), static_cast<int>(n_flat), MPI_INT64_T, 0, MPI_COMM_WORLD));
  std::vector<PrepUnit> units;
  for (size_t i = 0; i < flat.size(); i += 3) units.push_back({flat[i], flat[i + 1], flat[i + 2]});
  std::vector<double> weight;
  const auto [first_unit, end_unit] = share_units(inputs, units, world, &weight)[static_cast<size_t>(rank)];
  double share = 0;
  for (size_t i = first_unit; i < end_unit; ++i) share += weight[i];

  // Tokenize this rank's units into its scratch files.
  std::unique_ptr<TokenScratch> tokens_file;
  std::unique_ptr<Scratch> docs_file;
  int64_t my_tokens = 0, my_docs = 0, last_doc = -1, max_id = -1;
  UnitStats stats;
  PrepProgress progress(rank, share, total_bytes);
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    tokens_file = std::make_unique<TokenScratch>(scratch_path(args.output, rank, "tokens"),
                                                 tok->vocab_size());
    docs_file = std::make_unique<Scratch>(scratch_path(args.output, rank, "documents"));
    const PrepOptions options{args.jsonl_field, args.skip_bad_lines};
    const TokenSink sink{
        [&] {
          // An empty document starts where the next does: one start.
          if (my_tokens != last_doc) docs_file->append(&my_tokens, 1), ++my_docs;
          last_doc = my_tokens;
        },
        [&](const uint32_t* ids, size_t n) {
          tokens_file->append(ids, n);
          for (size_t i = 0; i < n; ++i) max_id = std::max<int64_t>(max_id, ids[i]);
          my_tokens += static_cast<int64_t>(n);
        }};
    for (size_t i = first_unit; i < end_unit; ++i) {
      const PrepUnit& u = units[i];
      const UnitStats s = tokenize_unit(inputs[static_cast<size_t>(u.input)], u, *tok, options, sink,
                                        [&](int64_t bytes) { progress.add(bytes, my_tokens); });
      stats.bytes += s.bytes;
      stats.bad_lines += s.bad_lines;
      stats.forced_cuts += s.forced_cuts;
    }
  });

  // Where each rank's part lands: tokens in order, then the split.
  const int64_t first = exscan_sum(my_tokens), total = allreduce(my_tokens, MPI_SUM);
  max_id = allreduce(max_id, MPI_MAX);
  const auto n_val = static_cast<int64_t>(args.val_fraction * static_cast<double>(total));
  const int64_t n_train = total - n_val;
  // Document starts, global; a rank's first may repeat the one before it
  // (empty inputs at the boundary): dropped.
  const int64_t before_max = [&] {
    int64_t mine = my_docs > 0 ? first + last_doc : -1, out = -1;
    MPI_CHECK(MPI_Exscan(&mine, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
    return rank == 0 ? int64_t{-1} : out;
  }();
  int64_t skip = 0, train_docs = 0;
  std::vector<int64_t> chunk;
  for (int64_t k0 = 0; k0 < my_docs; k0 += int64_t{1} << 20) {
    chunk.resize(static_cast<size_t>(std::min(my_docs - k0, int64_t{1} << 20)));
    docs_file->read(k0, static_cast<int64_t>(chunk.size()), chunk.data());
    for (const int64_t at : chunk) {
      if (first + at <= before_max) ++skip;
      else if (first + at < n_train) ++train_docs;
    }
  }
  const int64_t val_docs = my_docs - skip - train_docs;
  // The validation file's first token starts a document (the one the
  // split cut into continues as one) unless a document starts right there.
  const int64_t first_val_doc = allreduce(val_docs > 0 ? [&] {
    int64_t at = 0;
    docs_file->read(skip + train_docs, 1, &at);
    return first + at;
  }() : std::numeric_limits<int64_t>::max(), MPI_MIN);
  const int64_t val_extra = n_val > 0 && first_val_doc != n_train ? 1 : 0;
  const int64_t train_docs_first = exscan_sum(train_docs), val_docs_first = exscan_sum(val_docs);
  const int64_t all_train_docs = allreduce(train_docs, MPI_SUM), all_val_docs = allreduce(val_docs, MPI_SUM);

  const TokenFileLabel label{tok->vocab_size(), tok->name(), max_id};
  const auto read_tokens = [&](int64_t from) {
    return [&, from](int64_t at, int64_t n, uint32_t* out) { tokens_file->read(from + at, n, out); };
  };
  const auto read_docs = [&](int64_t from, int64_t shift, int64_t leading_zero) {
    return [&, from, shift, leading_zero](int64_t at, int64_t n, int64_t* out) {
      int64_t k = 0;
      if (leading_zero > 0 && at == 0) out[k++] = 0;
      const int64_t src = at - (leading_zero > 0 && at > 0 ? 1 : 0);
      if (n - k > 0) docs_file->read(from + src, n - k, out + k);
      for (; k < n; ++k) out[k] += shift;
    };
  };
  const std::string val_path = val_output_path(args.output);
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    if (args.format != "megatron") return;
    // One rank (checked above): the Megatron writer takes the whole stream.
    std::vector<uint32_t> all(static_cast<size_t>(total));
    if (total > 0) tokens_file->read(0, total, all.data());
    std::vector<int64_t> starts(static_cast<size_t>(my_docs));
    if (my_docs > 0) docs_file->read(0, my_docs, starts.data());
    const auto part = [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> d;
      for (int64_t s : starts)
        if (s >= lo && s < hi && (d.empty() || s - lo > d.back())) d.push_back(s - lo);
      if (d.empty() || d.front() != 0) d.insert(d.begin(), 0);
      return d;
    };
    write_megatron_dataset(args.output, std::vector<uint32_t>(all.begin(), all.begin() + n_train),
                           part(0, n_train), tok->vocab_size());
    if (n_val > 0)
      write_megatron_dataset(val_path, std::vector<uint32_t>(all.begin() + n_train, all.end()),
                             part(n_train, total), tok->vocab_size());
  });
  if (args.format != "megatron") {
    // Train: this rank's tokens below n_train; its documents after `skip`.
    TokenFilePart train;
    train.first = std::min(first, n_train);
    train.count = std::clamp<int64_t>(n_train - first, 0, my_tokens);
    train.read_tokens = read_tokens(0);
    train.docs_first = train_docs_first;
    train.docs = train_docs;
    train.read_documents = read_docs(skip, first, 0);
    write_token_file_parts(MPI_COMM_WORLD, args.output, n_train, all_train_docs, label, train);
    if (n_val > 0) {
      TokenFilePart val;
      const int64_t from = std::max<int64_t>(0, n_train - first);  // this rank's first val token
      val.first = std::max<int64_t>(0, first - n_train);
      val.count = my_tokens - std::min(from, my_tokens);
      val.read_tokens = read_tokens(from);
      const int64_t extra = rank == 0 ? val_extra : 0;
      val.docs_first = val_docs_first + (rank == 0 ? 0 : val_extra);
      val.docs = val_docs + extra;
      val.read_documents = read_docs(skip + train_docs, first - n_train, extra);
      write_token_file_parts(MPI_COMM_WORLD, val_path, n_val, all_val_docs + val_extra, label, val);
    }
  }
  const int64_t bytes = allreduce(stats.bytes, MPI_SUM), bad = allreduce(stats.bad_lines, MPI_SUM);
  const int64_t forced = allreduce(stats.forced_cuts, MPI_SUM);
  const int64_t docs = allreduce(my_docs - skip, MPI_SUM);
  if (rank == 0) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s: %lld tokens, vocab %lld, tokenizer %s%s\n", args.output.c_str(),
                static_cast<long long>(n_train), static_cast<long long>(tok->vocab_size()),
                tok->name().c_str(), args.format == "megatron" ? " (Megatron .bin and .idx)" : "");
    if (n_val > 0)
      std::printf("wrote %s: %lld tokens (the last %.1f%%, validation)\n", val_path.c_str(),
                  static_cast<long long>(n_val), 100.0 * args.val_fraction);
    std::printf("prep: %.1f MB of text, %lld documents, %lld tokens in %.2f s on %d rank(s): "
                "%.2f MB/s, %.2f MB/s per rank%s\n",
                static_cast<double>(bytes) / 1e6, static_cast<long long>(docs),
                static_cast<long long>(total), s, world, static_cast<double>(bytes) / 1e6 / s,
                static_cast<double>(bytes) / 1e6 / s / world,
                bad > 0 ? strprintf("; %lld bad JSON line(s) skipped", static_cast<long long>(bad)).c_str()
                        : "");
    if (forced > 0)
      std::fprintf(stderr, "mpiformer: warning: %lld place(s) in the text had no cut point for "
                   "%lld MB (one unbroken word): cut there, so the tokens around them depend on "
                   "where prep's pieces fell\n",
                   static_cast<long long>(forced), static_cast<long long>(kMaxCarry >> 20));
  }
  return 0;
}

}  // namespace mpiformer
