#include "core/mpi_check.hpp"

#include <climits>

namespace mpiformer {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, len);
}

int world_rank() {
  int initialized = 0, finalized = 0, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void broadcast_string(MPI_Comm comm, std::string& text, int root) {
  int len = static_cast<int>(text.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, root, comm));
  text.resize(static_cast<size_t>(len));
  MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, root, comm));
}

std::string lowest_rank_message(MPI_Comm comm, const std::string& mine, bool label_rank) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int have = mine.empty() ? INT_MAX : rank, first = INT_MAX;
  MPI_CHECK(MPI_Allreduce(&have, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return {};
  std::string text = mine;
  broadcast_string(comm, text, first);
  if (label_rank && first != 0) text += " (on rank " + std::to_string(first) + ")";
  return text;
}

}  // namespace mpiformer
