#include "core/error.hpp"

namespace mpiformer {

void throw_system_error(const char* call, const char* file, int line, const std::string& reason) {
  throw SystemError(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                    (reason.empty() ? std::string() : ": " + reason));
}

}  // namespace mpiformer
