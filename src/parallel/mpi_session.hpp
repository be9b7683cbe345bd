// MPI for the rest of the program (RAII): finalised last. Errors are
// returned to us instead of aborting inside MPI, so each failure is reported
// with its call site.
#pragma once
#include <mpi.h>

namespace mpiformer {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ends every rank of the job with `code`; for errors that not every rank
  // has seen, where a collective exit would hang.
  [[noreturn]] static void abort(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
};

// This rank's index among the ranks of its node (MPI_Comm_split_type
// shared), and how many they are. Collective over `comm`; {0, 1} where MPI
// was never started.
struct NodePlace {
  int rank = 0, size = 1;
};
NodePlace node_place(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace mpiformer
