#include "checkpoint_store.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace fs = std::filesystem;

CheckpointStore::CheckpointStore(std::string dir) : dir_(std::move(dir)) {}

std::string CheckpointStore::path_for_step(int64_t step) const {
  return dir_ + strprintf("/step_%08lld.h5", static_cast<long long>(step));
}

namespace {
// A complete checkpoint's name (a save in progress is step_NNNNNNNN.h5.tmp).
const std::regex& checkpoint_name() {
  static const std::regex kName(R"(step_[0-9]{8}\.h5)");
  return kName;
}
}  // namespace

void CheckpointStore::create_dir() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw InputError(dir_, "[checkpoint] dir", "cannot create: " + ec.message());
}

void CheckpointStore::publish_latest(const std::string& path, const std::string& run_id) const {
  write_file_durably(dir_ + "/latest",
                     fs::path(path).filename().string() + "\nrun " + run_id + "\n");
}

std::string CheckpointStore::latest() const {
  const std::string path = dir_ + "/latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  require_regular_file(path, "", "the pointer to the newest checkpoint");
  // Its first line, read no further than a name can be.
  char head[64] = {};
  std::ifstream(path).read(head, sizeof head);
  std::string name(head, strnlen(head, sizeof head));
  name = name.substr(0, name.find('\n'));
  if (!std::regex_match(name, checkpoint_name())) {
    throw InputError(path, "", "names \"" + name.substr(0, 64) +
                                   "\", which is not a complete checkpoint of this directory "
                                   "(step_NNNNNNNN.h5)");
  }
  return dir_ + "/" + name;
}

int CheckpointStore::remove_unfinished() const {
  static const std::regex kUnfinished(R"((step_[0-9]{8}\.h5|latest)\.tmp)");
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (std::regex_match(e.path().filename().string(), kUnfinished) && fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

std::vector<std::string> CheckpointStore::complete() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, checkpoint_name())) out.push_back(dir_ + "/" + name);
  }
  std::sort(out.rbegin(), out.rend());  // zero-padded: names sort by step
  return out;
}

void CheckpointStore::prune(int64_t keep) const {
  if (keep <= 0) return;
  const auto all = complete();
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
}

int64_t CheckpointStore::free_bytes() const {
  struct statvfs st {};
  if (::statvfs(dir_.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

int64_t CheckpointStore::step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return std::atoll(name.c_str() + 5);  // "step_" then the digits
}

std::string CheckpointStore::set_aside(const std::vector<std::string>& paths) const {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  std::string aside = dir_ + "/superseded-" + stamp;
  for (int i = 2; fs::exists(aside); ++i) aside = dir_ + "/superseded-" + stamp + strprintf("-%d", i);
  std::error_code ec;
  fs::create_directories(aside, ec);
  if (ec) throw SystemError("cannot create " + aside + ": " + ec.message());
  std::string named;
  try {
    named = latest();
  } catch (const InputError&) {
    // Not a pointer to any of `paths`: it stays.
  }
  for (const auto& p : paths) {
    durable_rename(p, aside + "/" + fs::path(p).filename().string());
    if (p == named) durable_rename(dir_ + "/latest", aside + "/latest");
  }
  return aside;
}

}  // namespace mpiformer
