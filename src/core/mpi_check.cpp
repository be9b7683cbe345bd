#include "core/mpi_check.hpp"

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

}  // namespace mpiformer
