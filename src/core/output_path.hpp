// An output never replaces an input: every command checks each path it
// will write against every file it reads, by identity (the same inode,
// through any link or spelling), before it reads or writes anything.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {

// True when `a` and `b` name the same file, or would (neither exists yet
// and their normalised paths agree).
bool same_file(const std::string& a, const std::string& b);

// Throws InputError naming `output` and `option` when it is one of
// `inputs` ({what it is, path}).
void refuse_input_as_output(const std::string& output, const std::string& option,
                            const std::vector<std::pair<std::string, std::string>>& inputs);

// Throws InputError naming `output` and `option` when the folder it would
// be written in does not exist or cannot be written: a mistake in the
// command (exit 2), found before the work whose result it would hold. A
// failure while writing (a full disk) stays a SystemError.
void require_writable_folder(const std::string& output, const std::string& option);

}  // namespace mpiformer
