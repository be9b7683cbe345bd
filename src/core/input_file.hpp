// Files read as input are checked before a byte is read: a FIFO would block
// the reader forever (and the watchdog does not watch set-up reads), a
// device would never end, a directory is no data.
#pragma once
#include <string>

namespace mpiformer {

// Throws InputError(path, field, why) unless `path` is a regular file (after
// symbolic links); `what` names what it should be ("a checkpoint", ...).
void require_regular_file(const std::string& path, const std::string& field,
                          const std::string& what);

}  // namespace mpiformer
