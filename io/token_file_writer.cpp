#include "token_file_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/mpi_check.hpp"
#include "core/output_file.hpp"
#include "hdf5_attributes.hpp"
#include "hdf5_handle.hpp"

namespace mpiformer {

namespace {

constexpr int64_t kPiece = int64_t{1} << 22;  // elements written at a time

hid_t stored_type(int64_t vocab_size) {
  const int64_t b = token_bytes(vocab_size);
  return b == 1 ? H5T_STD_U8LE : b == 2 ? H5T_STD_U16LE : H5T_STD_U32LE;
}

// Rows [first, first + n) of a 1-D dataset from this rank, `read` giving
// them a piece at a time (independent I/O: ranks write different amounts).
template <class T>
void write_rows(hid_t dset, hid_t memtype, int64_t first, int64_t n,
                const std::function<void(int64_t, int64_t, T*)>& read, const std::string& path) {
  std::vector<T> buf(static_cast<size_t>(std::min(n, kPiece)));
  H5Handle fspace(H5Dget_space(dset), H5Sclose);
  for (int64_t at = 0; at < n; at += kPiece) {
    const int64_t m = std::min(kPiece, n - at);
    read(at, m, buf.data());
    const hsize_t start[1] = {static_cast<hsize_t>(first + at)}, count[1] = {static_cast<hsize_t>(m)};
    H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path);
    H5Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
    if (H5Dwrite(dset, memtype, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
      throw InputError(path, "", "writing failed (a full disk?)");
  }
}

}  // namespace

int64_t token_bytes(int64_t vocab_size) { return vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 2 : 4; }

void write_token_file_parts(MPI_Comm comm, const std::string& path, int64_t total_tokens,
                            int64_t total_documents, const TokenFileLabel& label,
                            const TokenFilePart& mine) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const std::string tmp = path + ".tmp";
  std::string failure;
  const auto agree = [&] {
    int bad = failure.empty() ? 0 : 1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm));
    return bad != 0;
  };
  // Afresh: a link planted at the .tmp's name is removed, never followed.
  if (rank == 0) {
    try {
      ::close(open_output(tmp, OutputMode::kReplace, "--output"));
    } catch (const InputError& e) {
      failure = e.what();
    }
  }
  if (agree()) {
    throw InputError(path, "--output", rank == 0 ? failure : "cannot be written (see rank 0)");
  }
  {
    H5QuietErrors quiet;
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), tmp);
    use_checksummed_format(fapl.get(), tmp);
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file.valid()) throw InputError(path, "--output", "cannot create (is the directory writable?)");
    const hsize_t dims[1] = {static_cast<hsize_t>(total_tokens)};
    H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    H5Handle tokens(H5Dcreate2(file.get(), "tokens", stored_type(label.vocab_size), space.get(),
                               H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose);
    H5_CHECK(tokens.get(), tmp);
    H5Handle docs;
    if (total_documents > 0) {
      const hsize_t ddims[1] = {static_cast<hsize_t>(total_documents)};
      H5Handle dspace(H5Screate_simple(1, ddims, nullptr), H5Sclose);
      docs = H5Handle(H5Dcreate2(file.get(), "documents", H5T_STD_I64LE, dspace.get(), H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose);
      H5_CHECK(docs.get(), tmp);
    }
    try {
      write_rows<uint32_t>(tokens.get(), H5T_NATIVE_UINT32, mine.first, mine.count, mine.read_tokens, tmp);
      if (docs.valid())
        write_rows<int64_t>(docs.get(), H5T_NATIVE_INT64, mine.docs_first, mine.docs,
                            mine.read_documents, tmp);
    } catch (const InputError& e) {
      failure = e.what();
    }
    write_int_attr(file.get(), "vocab_size", label.vocab_size, tmp);
    write_string_attr(file.get(), "tokenizer", label.tokenizer, tmp);
    write_int_attr(file.get(), "max_token_id", label.max_token_id, tmp);
  }  // closed, collectively, here
  if (agree()) {
    if (rank == 0) std::remove(tmp.c_str());
    throw InputError(path, "--output", failure.empty() ? "another rank could not write its part" : failure);
  }
  if (rank == 0) {
    try {
      durable_rename(tmp, path);
    } catch (const SystemError& e) {
      std::remove(tmp.c_str());
      failure = std::string("cannot put the finished file in place: ") + e.what();
    }
  }
  if (agree()) throw InputError(path, "--output", rank == 0 ? failure : "cannot be put in place (see rank 0)");
}

}  // namespace mpiformer
