// Errors: one exception type for bad user input (names the file and the field)
// and one for failed library calls; check macros carry the call, file and line.
#pragma once
#include <stdexcept>
#include <string>

namespace mpiformer {

// Bad input a user can fix: a deck, a dataset, a checkpoint, a layout.
// Every rank reads the same inputs, so every rank raises the same InputError;
// the driver prints it once (rank 0) and all ranks exit non-zero.
class InputError : public std::runtime_error {
 public:
  InputError(const std::string& file, const std::string& field, const std::string& what)
      : std::runtime_error(compose(file, field, what)), file_(file), field_(field), reason_(what) {}
  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }
  // What is wrong, without the file and field.
  const std::string& reason() const { return reason_; }

 private:
  static std::string compose(const std::string& file, const std::string& field,
                             const std::string& what) {
    std::string msg = file;
    if (!field.empty()) msg += (msg.empty() ? "" : ": ") + field;
    return msg + (msg.empty() ? "" : ": ") + what;
  }
  std::string file_, field_, reason_;
};

// An InputError that every rank raises at the same point with the same
// message after set-up (they judged the same all-reduced values): the job
// can end like a set-up input error, the message once and exit 2 on every
// rank, instead of aborting as a failure of one rank must.
class AgreedInputError : public InputError {
 public:
  using InputError::InputError;
};

// A library call (MPI, HDF5, BLAS, I/O) failed: a bug or a broken system.
class SystemError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An output could not be written (a full or read-only file system, a quota):
// a condition that a restart into the same place would only repeat, so the
// job ends with kExitStorage, which the job scripts do not restart.
class StorageError : public SystemError {
 public:
  using SystemError::SystemError;
};

// Bad input (every InputError), and any other failure.
constexpr int kExitInputError = 2;
constexpr int kExitFailure = 3;

// EX_IOERR from sysexits.h.
constexpr int kExitStorage = 74;

// The run's own working state was taken from under it by something outside
// the program (its offloaded optimizer files removed, replaced or cut): the
// last published checkpoint is intact and a restart from it succeeds, so the
// job ends with kExitRequeue, which the job scripts requeue.
class RestartableError : public SystemError {
 public:
  using SystemError::SystemError;
};

// "Stopped to be requeued": the job scripts requeue on this code only.
// (EX_TEMPFAIL from sysexits.h.)
constexpr int kExitRequeue = 75;

[[noreturn]] void throw_system_error(const char* call, const char* file, int line,
                                     const std::string& reason);

}  // namespace mpiformer

// Checks a condition that must hold unless something outside the program broke.
#define MPIFORMER_CHECK(cond, reason)                                         \
  do {                                                                       \
    if (!(cond)) ::mpiformer::throw_system_error(#cond, __FILE__, __LINE__, (reason)); \
  } while (0)
