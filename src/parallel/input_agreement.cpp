#include "parallel/input_agreement.hpp"

#include <climits>
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
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int mine = failed ? rank : INT_MAX, first = INT_MAX;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  // The lowest failing rank's message, to every rank.
  std::string text = file + '\0' + field + '\0' + reason;
  int len = static_cast<int>(text.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  text.resize(static_cast<size_t>(len));
  MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, first, comm));
  const size_t a = text.find('\0'), b = text.find('\0', a + 1);
  throw InputError(text.substr(0, a), text.substr(a + 1, b - a - 1),
                   text.substr(b + 1) + (first != 0 ? " (on rank " + std::to_string(first) + ")" : ""));
}

}  // namespace mpiformer
