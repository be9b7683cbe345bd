// Files that are either whole or absent, even across a crash or a power
// loss: written under a temporary name, flushed to disk, renamed into
// place, and the directory flushed so the new name is on disk too. Used by
// checkpoints, the `latest` pointer and prep's outputs.
#pragma once
#include <string>

namespace mpiformer {

// Moves the finished file `tmp` to `path`: fsync(tmp), rename, fsync of the
// directory. Throws SystemError naming the file and the reason.
void durable_rename(const std::string& tmp, const std::string& path);

// Writes `text` to `path` through `path`.tmp and durable_rename.
void write_file_durably(const std::string& path, const std::string& text);

}  // namespace mpiformer
