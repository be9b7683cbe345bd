#include "core/output_path.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
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

void require_writable_folder(const std::string& output, const std::string& option) {
  namespace fs = std::filesystem;
  fs::path folder = fs::path(output).parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw InputError(output, option, "its folder " + folder.string() + " does not exist");
  if (access(folder.c_str(), W_OK) != 0)
    throw InputError(output, option,
                     "cannot write in its folder " + folder.string() + ": " + std::strerror(errno));
}

}  // namespace mpiformer
