// Every file the program creates, truncates or appends to is opened here,
// so that a symbolic link, a FIFO or anything else that is not a regular
// file planted in its place (shared scratch without a sticky bit is common
// on clusters) is never written through: the target of a planted link
// stays untouched, and opening a FIFO never blocks.
//   kReplace  the file is the program's to replace (a .tmp, a heartbeat, a
//             trace, an export's output under its temporary name): whatever
//             entry has the name is removed first (a link itself, never its
//             target; a directory is refused), then the file is created
//             afresh (O_EXCL).
//   kAppend   a log kept across a run's restarts (metrics.jsonl): opened in
//             place, created if absent; a link or a non-regular file is
//             refused.
//   kLock     a lock file: opened in place for reading and writing, created
//             if absent, never truncated; a link or a non-regular file is
//             refused.
// Refusals are InputError naming the file and `what` (the key or option
// that put it there), before anything is written.
#pragma once
#include <cstdio>
#include <string>

namespace mpiformer {

enum class OutputMode { kReplace, kAppend, kLock };

// A file descriptor (O_CLOEXEC; kAppend: O_APPEND), the caller's to close.
// `truncate` (kAppend only): empty it once opened.
int open_output(const std::string& path, OutputMode mode, const std::string& what,
                bool truncate = false);
// The same as a stdio stream for writing ("w" semantics for kReplace).
std::FILE* open_output_stream(const std::string& path, OutputMode mode, const std::string& what);

}  // namespace mpiformer
