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
#include "train/goodput.hpp"
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

// Three launches of one run directory, with made-up step and save times
// (the figures a ledger adds up are what it is told): the first dies after
// step 7 (saved at 2, 4, 6), the second resumes from 6, saves at 8 and 10
// and dies after 11, the third resumes from 8 (as when 10's checkpoint is
// found damaged) and runs to 12. What the run kept: steps 1-6 of the
// first, 7-8 of the second, 9-12 of the third.
TEST(Goodput, RestartsSettleAgainstTheStepResumedFrom) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  {
    GoodputLedger a(run, true, false, 0);
    a.steps_begin();
    for (int s = 1; s <= 7; ++s) {
      a.step_done(s, 1.0);
      if (s % 2 == 0) a.save_done(s, 0.25);
      a.write();
    }
  }
  {
    GoodputLedger b(run, true, true, 6);
    EXPECT_EQ(b.warning(), "");
    b.restored(0.5);
    b.steps_begin();
    for (int s = 7; s <= 11; ++s) {
      b.step_done(s, 2.0);
      if (s == 8 || s == 10) b.save_done(s, 0.5);
      b.write();
    }
    const GoodputTotals t = b.totals();
    EXPECT_EQ(t.launches, 2);
    EXPECT_EQ(t.steps_redone, 1);                 // step 7
    EXPECT_DOUBLE_EQ(t.productive, 6.0 + 5 * 2.0);  // 1-6, then 7-11 so far
  }
  GoodputLedger c(run, true, true, 8);
  EXPECT_EQ(c.warning(), "");
  c.steps_begin();
  for (int s = 9; s <= 12; ++s) c.step_done(s, 3.0);
  const GoodputTotals t = c.totals();
  EXPECT_EQ(t.launches, 3);
  EXPECT_EQ(t.steps_redone, 1 + 3);  // 7 once, then 9-11
  EXPECT_DOUBLE_EQ(t.productive, 6 * 1.0 + 2 * 2.0 + 4 * 3.0);
  EXPECT_DOUBLE_EQ(t.steps, 7 * 1.0 + 5 * 2.0 + 4 * 3.0);
  EXPECT_EQ(t.save_count, 5);
  EXPECT_DOUBLE_EQ(t.saves, 3 * 0.25 + 2 * 0.5);
  EXPECT_DOUBLE_EQ(t.restore, 0.5);
  EXPECT_EQ(t.step_count, 16);
  EXPECT_GT(t.wall, 0);
  EXPECT_DOUBLE_EQ(t.goodput(), t.productive / t.wall);
  EXPECT_NEAR(c.mean_save(), 1.75 / 5, 1e-12);
  // Young and Daly: sqrt(2 x 30 s x 24 h) = 2277 s.
  EXPECT_NEAR(young_daly_interval(30, 24 * 3600), 2276.84, 0.01);
}

// A ledger that is not one (damaged, edited) is named and the figures
// start again; a launch that starts a run afresh starts a new ledger.
TEST(Goodput, ADamagedLedgerIsNamedAndNeverStopsTheRun) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  {
    GoodputLedger a(run, true, false, 0);
    a.step_done(1, 1.0);
    a.save_done(1, 0.25);
    a.write();
  }
  const std::string good = [&] {
    std::ifstream in(run + "/goodput.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::pair<std::string, std::string> damaged[] = {
      {"garbage\n", "line 1"},
      {good + "kept 2 -1\n", "line 5"},
      {good.substr(0, good.find("\nlaunch")) + "\n", "no settled or launch line"},
      {std::string(good).replace(good.find("steps_redone"), 12, "steps_rdone"), "line 2"},
  };
  for (const auto& [text, why] : damaged) {
    std::ofstream(run + "/goodput.txt") << text;
    GoodputLedger b(run, true, true, 1);
    EXPECT_NE(b.warning().find(run + "/goodput.txt: " + why), std::string::npos) << b.warning();
    EXPECT_EQ(b.totals().launches, 1);
    EXPECT_EQ(b.totals().productive, 0);
  }
  std::ofstream(run + "/goodput.txt") << good;
  GoodputLedger fresh(run, true, false, 0);
  EXPECT_EQ(fresh.warning(), "");
  EXPECT_EQ(fresh.totals().launches, 1);
  GoodputLedger resumed(run, true, true, 1);
  EXPECT_EQ(resumed.totals().launches, 2);
  EXPECT_DOUBLE_EQ(resumed.totals().productive, 1.0);
}

}  // namespace
}  // namespace mpiformer::test
