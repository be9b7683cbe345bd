#include "train/run_record.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <initializer_list>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "parallel/nccl_version.hpp"

extern char** environ;

namespace mpiformer {

namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// Set by Open MPI's mpirun in every rank's environment whatever the user
// asked for (its daemon's address, session directories, the job id, the
// oversubscription it computed): recording them would bury the choices.
bool launcher_bookkeeping(const std::string& name) {
  for (const char* p : {"OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                        "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_MCA_mpi_oversubscribe"}) {
    if (starts_with(name, p)) return true;
  }
  return false;
}

}  // namespace

LaunchEnvironment launch_environment(bool gpu) {
  LaunchEnvironment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    if (!(starts_with(name, "NCCL_") || starts_with(name, "UCX_") ||
          starts_with(name, "OMPI_MCA_")) ||
        launcher_bookkeeping(name)) {
      continue;
    }
    env.vars.emplace_back(name, kv.substr(eq + 1));
  }
  std::sort(env.vars.begin(), env.vars.end());
  if (gpu) env.nccl = nccl_version();
  return env;
}

std::string environment_json(const LaunchEnvironment& env) {
  std::string json = "{\"environment\": {";
  for (size_t i = 0; i < env.vars.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_string(env.vars[i].first) + ": " +
            json_string(env.vars[i].second);
  }
  json += "}";
  if (!env.nccl.empty()) json += ", \"nccl\": " + json_string(env.nccl);
  return json + "}";
}

std::string environment_line(const LaunchEnvironment& env) {
  std::string line = "env:  ";
  if (env.vars.empty()) line += " no NCCL_*, UCX_* or OMPI_MCA_* variables set";
  for (const auto& [name, value] : env.vars) line += " " + name + "=" + value;
  if (!env.nccl.empty()) line += "; NCCL " + env.nccl;
  return line;
}

std::string finished_marker(const std::string& run_dir) { return run_dir + "/finished"; }

void clear_finished(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::remove(finished_marker(run_dir), ec);
  if (ec) {
    throw SystemError("cannot remove " + finished_marker(run_dir) +
                      " (the job scripts would take this launch for finished): " + ec.message());
  }
}

void mark_finished(const std::string& run_dir, int64_t step, int64_t steps,
                   const std::string& run_id) {
  write_file_durably(finished_marker(run_dir),
                     strprintf("finished step %lld of %lld (run %s)\n",
                               static_cast<long long>(step), static_cast<long long>(steps),
                               run_id.c_str()));
}

}  // namespace mpiformer
