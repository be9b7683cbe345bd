#include "parallel/input_agreement.hpp"

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

void agree_on_input_errors(MPI_Comm comm, const std::function<void()>& local_checks) {
  std::string file, field, reason;
  bool failed = false;
  try {
    local_checks();
  } catch (const InputError& e) {
    failed = true;
    file = e.file();
    field = e.field();
    reason = e.reason();
  }
  // The lowest failing rank's message, to every rank.
  const std::string text =
      lowest_rank_message(comm, failed ? file + '\0' + field + '\0' + reason : std::string());
  if (text.empty()) return;
  const size_t a = text.find('\0'), b = text.find('\0', a + 1);
  throw InputError(text.substr(0, a), text.substr(a + 1, b - a - 1), text.substr(b + 1));
}


void agree_on_view(MPI_Comm comm, const std::string& view, const std::string& file,
                   const std::string& field) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  // Every rank runs the same binary, so std::hash agrees across ranks.
  const uint64_t mine = std::hash<std::string>{}(view);
  std::vector<uint64_t> all(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm));
  int other = 0;
  for (int r = 1; r < size && other == 0; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) other = r;
  if (other == 0) return;
  std::string first = view, theirs = view;
  broadcast_string(comm, first, 0);
  broadcast_string(comm, theirs, other);
  throw InputError(file, field,
                   "differs between ranks (edited between node launches, or a different copy on "
                   "some node?): rank 0 reads " + first + ", rank " + std::to_string(other) +
                       " reads " + theirs);
}

}  // namespace mpiformer
