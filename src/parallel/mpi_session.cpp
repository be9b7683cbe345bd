#include "parallel/mpi_session.hpp"

#include <cstdlib>

#include "core/mpi_check.hpp"

namespace mpiformer {

MpiSession::MpiSession(int* argc, char*** argv) {
  MPI_CHECK(MPI_Init(argc, argv));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

NodePlace node_place(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return {};  // a command run by hand without MPI: alone
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  NodePlace p;
  MPI_CHECK(MPI_Comm_rank(node, &p.rank));
  MPI_CHECK(MPI_Comm_size(node, &p.size));
  MPI_CHECK(MPI_Comm_free(&node));
  return p;
}

}  // namespace mpiformer
