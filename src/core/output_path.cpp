#include "core/output_path.hpp"

#include <filesystem>

#include "core/error.hpp"

namespace mpiformer {

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

void refuse_input_as_output(const std::string& output, const std::string& option,
                            const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [what, path] : inputs) {
    if (!path.empty() && same_file(output, path)) {
      throw InputError(output, option,
                       "is also " + what + " (" + path +
                           "): writing it would replace an input; choose another name");
    }
  }
}

}  // namespace mpiformer
