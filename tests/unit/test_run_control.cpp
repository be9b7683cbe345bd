// The small parts a run's safety rests on: durable files (whole or absent,
// never half-written under the final name) and the stop policy's deadline
// arithmetic, against values worked out by hand.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"
#include "train/stop_policy.hpp"

namespace mpiformer::test {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DurableFile, ReplacesWholeAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("latest");
  write_file_durably(path, "step_1.h5\n");
  write_file_durably(path, "step_2.h5\n");
  EXPECT_EQ(slurp(path), "step_2.h5\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DurableFile, FailureNamesTheFileAndKeepsTheOldOne) {
  TempDir dir;
  const std::string path = dir.write("keep", "old");
  try {
    durable_rename(dir.file("missing.tmp"), path);
    ADD_FAILURE() << "renaming a missing file succeeded";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.tmp"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(path), "old");
  EXPECT_THROW(write_file_durably(dir.file("no/such/dir/latest"), "x"), SystemError);
}

TEST(StopPolicy, StopsWhenStepReserveAndSaveWouldPassTheDeadline) {
  ::unsetenv("SLURM_JOB_END_TIME");
  const auto now = StopPolicy::Clock::now();
  // 100 s limit; a save of 1e9 bytes is guessed at 10 s (100 MB/s).
  StopPolicy p(100.0, 1000000000);
  EXPECT_FALSE(p.out_of_time(now));  // 1.2 * 10 s < 100 s
  p.step_took(30.0);                 // 1.2 * (30 + 30 + 10) = 84 s
  EXPECT_FALSE(p.out_of_time(now));
  p.step_took(40.0);  // mean 35: 1.2 * (35 + 35 + 10) = 96 s
  EXPECT_FALSE(p.out_of_time(now));
  p.save_took(20.0);  // measured saves replace the guess: 1.2 * 90 = 108 s
  EXPECT_TRUE(p.out_of_time(now));
  // An evaluation longer than a step is what the reserve covers.
  StopPolicy q(100.0, 0);
  q.step_took(10.0);
  q.eval_took(60.0);  // 1.2 * (10 + 60) = 84 s
  EXPECT_FALSE(q.out_of_time(now));
  q.eval_took(80.0);  // 1.2 * (10 + 80) = 108 s
  EXPECT_TRUE(q.out_of_time(now));
}

TEST(StopPolicy, SlurmEndTimeIsADeadlineToo) {
  const auto at = std::to_string(static_cast<long long>(std::time(nullptr)) + 50);
  ::setenv("SLURM_JOB_END_TIME", at.c_str(), 1);
  StopPolicy p(0.0, 0);  // no limit of our own
  ::unsetenv("SLURM_JOB_END_TIME");
  EXPECT_LE(p.deadline_s(), 50.0);
  EXPECT_GE(p.deadline_s(), 45.0);
  p.step_took(30.0);  // 1.2 * 60 = 72 s > ~50 s
  EXPECT_TRUE(p.out_of_time(StopPolicy::Clock::now()));
  StopPolicy none(0.0, 0);
  none.step_took(1e6);
  EXPECT_FALSE(none.out_of_time(StopPolicy::Clock::now()));
}

}  // namespace
}  // namespace mpiformer::test
