// The optimizer's state wherever [train] offload puts it
// (train/adamw_state.hpp): streamed through host memory or files in small
// blocks, the update is bit-identical to the resident one (in bf16 with
// the masters offloaded too); and the files'
// life (io/offload_files.hpp): locked, reserved, replaced, removed, and
// errors that name the directory or the file.
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.hpp"
#include "host/ops.hpp"
#include "offload_files.hpp"
#include "run_lock.hpp"
#include "reference.hpp"
#include "temp_dir.hpp"
#include "train/adamw_state.hpp"

namespace mpiformer::test {
namespace {

using HostOps = host::Ops<float>;

struct Moments {
  std::vector<float> p, m, v;
};

// Three steps of AdamW over `chunks` (moments of n; parameters at
// param_offset in p, of np) with the moments placed as `where` says.
Moments three_steps(const std::vector<AdamWChunk>& chunks, int64_t n, int64_t np,
                const OffloadSetup& where) {
  host::Context ctx;
  AdamWState<HostOps> state(ctx, n, chunks, where);
  std::vector<float> p(np);
  const auto init = random_vector(np, 7);
  for (int64_t i = 0; i < np; ++i) p[i] = static_cast<float>(init[i]);
  for (int step = 1; step <= 3; ++step) {
    const auto gd = random_vector(n, 10 + step);
    std::vector<float> g(gd.begin(), gd.end());
    state.step(p.data(), g.data(), AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.7}, nullptr);
  }
  Moments r;
  r.p = p;
  for (int k = 0; k < 2; ++k) {
    const float* x = state.moment(k);
    (k == 0 ? r.m : r.v).assign(x, x + n);
  }
  state.release_views();
  return r;
}

// Two tensors with different decay, a gap that stays untouched, chunks
// of kAdamWChunkElements across the (small) blocks' boundaries, and the
// parameters somewhere else than the moments (fp32 ZeRO's masters are the
// stage's weights, at other offsets).
TEST(AdamWState, OffloadedUpdatesAreBitIdenticalToResident) {
  const int64_t n1 = 2 * kAdamWChunkElements + 999, gap = 1000, n2 = 5000;
  const int64_t n = n1 + gap + n2, shift = 333, np = n + shift;
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, n1, true, shift);
  append_adamw_chunks(chunks, n1 + gap, n2, false, n1 + gap + shift);
  const Moments want = three_steps(chunks, n, np, OffloadSetup{});
  TempDir dir;
  // 2048-element blocks: a chunk spans up to nine, and the ring of three
  // slots turns over many times.
  for (const Offload where : {Offload::kHost, Offload::kNvme}) {
    OffloadSetup s{where, dir.file(""), 0, 1, 2048};
    const Moments got = three_steps(chunks, n, np, s);
    EXPECT_EQ(0, std::memcmp(got.p.data(), want.p.data(), 4 * want.p.size())) << name_of(where);
    EXPECT_EQ(0, std::memcmp(got.m.data(), want.m.data(), 4 * want.m.size())) << name_of(where);
    EXPECT_EQ(0, std::memcmp(got.v.data(), want.v.data(), 4 * want.v.size())) << name_of(where);
    // The gap's parameters never moved; its moments stay zero.
    EXPECT_EQ(got.p[n1 + shift + 10], want.p[n1 + shift + 10]);
    EXPECT_EQ(got.m[n1 + 10], 0.0f);
  }
  // And the update did something (a test that cannot fail is none).
  const auto init = random_vector(np, 7);
  EXPECT_NE(want.p[shift], static_cast<float>(init[shift]));
}

// bf16: offloaded, the float masters go with the moments (the back end
// keeps only the 16-bit copy), the copy is written from them at the start
// and by each update. Against the resident update: every bit of the
// masters, the moments and the copy, gap (padding) included. The
// gradients and the copy at offsets of their own (ZeRO 1 keeps them in
// the stage's whole buffers, AdamWChunk).
TEST(AdamWState, OffloadedMastersInMixedPrecisionAreBitIdentical) {
  using Ops16 = host::Ops<host::Bf16>;
  const int64_t n1 = kAdamWChunkElements + 777, gap = 300, n2 = 3000, n = n1 + gap + n2;
  const int64_t gshift = 111, cshift = 222;
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, AdamWPlaces{0, 0, gshift, cshift}, n1, true);
  append_adamw_chunks(chunks, AdamWPlaces{n1 + gap, n1 + gap, n1 + gap + gshift, n1 + gap + cshift},
                      n2, false);
  struct Out {
    std::vector<float> p, m, v;
    std::vector<uint16_t> copy;
    double offloaded = 0;
  };
  const auto run = [&](const OffloadSetup& where) {
    host::Context ctx;
    AdamWState<Ops16> state(ctx, n, chunks, where);
    EXPECT_EQ(state.holds_masters(), where.where != Offload::kNone);
    const auto init = random_vector(n, 5);
    std::vector<float> p(init.begin(), init.end());
    std::fill(p.begin() + n1, p.begin() + n1 + gap, 0.0f);
    std::vector<host::Bf16> copy(static_cast<size_t>(n + cshift));
    if (state.holds_masters()) {
      state.load(p.data(), nullptr, nullptr);
      state.write_weights(copy.data());
    } else {
      Ops16::convert(ctx, copy.data() + cshift, p.data(), n);
    }
    for (int step = 1; step <= 3; ++step) {
      const auto gd = random_vector(n + gshift, 20 + step);
      std::vector<float> g(gd.begin(), gd.end());
      state.step(state.holds_masters() ? nullptr : p.data(), g.data(),
                 AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.7}, copy.data());
    }
    Out r;
    const float* master = state.holds_masters() ? state.master() : p.data();
    r.p.assign(master, master + n);
    for (int k = 0; k < 2; ++k) {
      const float* x = state.moment(k);
      (k == 0 ? r.m : r.v).assign(x, x + n);
    }
    for (const host::Bf16 c : copy) r.copy.push_back(c.bits);
    r.offloaded = state.offloaded_bytes();
    state.release_views();
    return r;
  };
  const Out want = run(OffloadSetup{});
  TempDir dir;
  for (const Offload where : {Offload::kHost, Offload::kNvme}) {
    const Out got = run(OffloadSetup{where, dir.file(""), 0, 1, 2048});
    EXPECT_EQ(got.p, want.p) << name_of(where);
    EXPECT_EQ(got.m, want.m) << name_of(where);
    EXPECT_EQ(got.v, want.v) << name_of(where);
    EXPECT_EQ(got.copy, want.copy) << name_of(where);
    EXPECT_EQ(got.offloaded, 12.0 * static_cast<double>(n)) << name_of(where);
  }
  EXPECT_NE(want.p[0], static_cast<float>(random_vector(n, 5)[0]));
  EXPECT_EQ(want.copy[cshift + n1 + 5], 0);  // padding stays zero
  EXPECT_NE(want.copy[cshift], 0);           // the copy is where its offsets say
}

TEST(OffloadFiles, LockedReservedReplacedAndRemoved) {
  TempDir dir;
  const std::string d = dir.file("");
  const std::string stale = d + "/mpiformer-offload.rank3.adam_m";
  std::ofstream(stale) << "left by an earlier run";
  {
    OffloadFiles files(d, 3, 4, 1, {"adam_m", "adam_v"}, 5000);
    EXPECT_TRUE(files.replaced_stale());
    struct stat st {};
    ASSERT_EQ(0, ::stat(stale.c_str(), &st));
    EXPECT_GE(st.st_size, 4 * 5000);  // reserved at once, padded to 4 KiB
    EXPECT_EQ(st.st_size % OffloadFiles::kAlignBytes, 0);
    // A second run in the same place meets the lock before any file.
    try {
      OffloadFiles second(d, 3, 4, 1, {"adam_m"}, 10);
      ADD_FAILURE() << "a second user of the same files was not refused";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "[train] offload_dir");
      EXPECT_NE(std::string(e.what()).find("another job"), std::string::npos) << e.what();
    }
    // Written and read back through the aligned path.
    AlignedFloats out(5000), in(5000);
    for (int i = 0; i < 5000; ++i) out.get()[i] = static_cast<float>(i) * 0.5f;
    files.write(1, 0, 5000, out.get()).get();
    files.read(1, 0, 5000, in.get()).get();
    EXPECT_EQ(0, std::memcmp(out.get(), in.get(), 4 * 5000));
    EXPECT_EQ(files.map(1)[4999], 4999 * 0.5f);
    files.unmap_all();
  }
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(d + "/mpiformer-offload.rank3.adam_v"));
}

// An earlier run of 6 ranks killed before it removed its files: a run of
// 2 ranks removes those of ranks 2-5 (rank 0 the even ones, rank 1 the
// odd), except where a live process holds that rank's lock; nothing else
// in the directory is touched.
TEST(OffloadFiles, StaleRanksOfALargerRunAreRemoved) {
  TempDir dir;
  const std::string d = dir.file("");
  auto path = [&](int r, const char* name) { return d + "/mpiformer-offload.rank" + std::to_string(r) + "." + name; };
  for (int r = 2; r < 6; ++r)
    for (const char* name : {"adam_m", "adam_v"}) std::ofstream(path(r, name)) << "left by an earlier run";
  std::ofstream(d + "/mpiformer-offload.rankX.adam_m") << "not an offload file of ours";
  std::ofstream(d + "/notes.txt") << "the user's";
  // A link under a stale rank's name: the link goes, never what it names.
  std::filesystem::create_symlink(d + "/notes.txt", path(4, "adam_g"));
  {
    const RunLock live(d, "[train] offload_dir", ".lock-offload-rank5");  // a live holder of rank 5
    OffloadFiles zero(d, 0, 2, 2, {"adam_m"}, 1024);
    EXPECT_EQ(zero.removed_stale_ranks(), 2);  // ranks 2 and 4
    for (int r : {2, 4}) EXPECT_FALSE(std::filesystem::exists(path(r, "adam_v"))) << r;
    EXPECT_FALSE(std::filesystem::is_symlink(path(4, "adam_g")));
    for (int r : {3, 5}) EXPECT_TRUE(std::filesystem::exists(path(r, "adam_m"))) << r;
    OffloadFiles one(d, 1, 2, 2, {"adam_m"}, 1024);
    EXPECT_EQ(one.removed_stale_ranks(), 1);  // rank 3; rank 5's lock is held
    EXPECT_FALSE(std::filesystem::exists(path(3, "adam_m")));
    EXPECT_TRUE(std::filesystem::exists(path(5, "adam_m")));
    EXPECT_TRUE(std::filesystem::exists(path(5, "adam_v")));
  }
  EXPECT_TRUE(std::filesystem::exists(d + "/mpiformer-offload.rankX.adam_m"));
  EXPECT_TRUE(std::filesystem::exists(d + "/notes.txt"));
  // Unknown world size: nothing of other ranks touched.
  OffloadFiles files(d, 0, 0, 1, {"adam_m"}, 1024);
  EXPECT_EQ(files.removed_stale_ranks(), 0);
  EXPECT_TRUE(std::filesystem::exists(path(5, "adam_m")));
}

// The room a stale rank's files free is their own: a link planted under a
// stale rank's name (here to an 8 TiB sparse file) frees nothing. A node of
// ranks needing 4 TiB more than the disk has is refused, not admitted on
// the link's target's size.
TEST(OffloadFiles, ALinkUnderAStaleNameFreesNoRoom) {
  TempDir dir;
  const std::string d = dir.file("");
  const std::string big = d + "/user.bin";
  constexpr double kTiB = 1099511627776.0;
  { std::ofstream(big) << ""; }
  if (::truncate(big.c_str(), static_cast<off_t>(8 * kTiB)) != 0)
    GTEST_SKIP() << "this file system holds no 8 TiB sparse file";
  std::filesystem::create_symlink(big, d + "/mpiformer-offload.rank3.adam_m");  // rank 1's to remove
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(d.c_str(), &fs), 0);
  const double free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  const int64_t elements = OffloadFiles::kAlignElements;
  const double need = 4.0 * static_cast<double>(elements);
  const double ranks = (free + 4 * kTiB) / need + 1;
  ASSERT_LT(ranks, 2e9);
  try {
    OffloadFiles files(d, 0, 2, static_cast<int>(ranks), {"adam_m"}, elements);
    ADD_FAILURE() << "admitted on the room of a link's target";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("MB needed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(big), static_cast<uintmax_t>(8 * kTiB));
}

TEST(OffloadFiles, RefusesAMissingDirectoryAndOneWithoutRoom) {
  TempDir dir;
  const auto refused = [](const std::string& d, int ranks, const char* says) {
    try {
      OffloadFiles files(d, 0, 1, ranks, {"adam_m", "adam_v"}, 1 << 20);
      ADD_FAILURE() << "not refused: " << d;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), d);
      EXPECT_EQ(e.field(), "[train] offload_dir");
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(dir.file("missing"), 1, "does not exist");
  // 8 MiB per rank times a node of a billion ranks: more than any disk.
  refused(dir.file(""), 1 << 30, "MB needed");
  EXPECT_FALSE(std::filesystem::exists(dir.file("mpiformer-offload.rank0.adam_m")));
}

TEST(OffloadFiles, AFailedWriteNamesTheFile) {
  TempDir dir;
  ::setenv("MPIFORMER_FAULT_OFFLOAD_WRITE", "2", 1);
  OffloadFiles files(dir.file(""), 0, 1, 1, {"adam_m"}, 1024);
  AlignedFloats b(1024);
  files.write(0, 0, 1024, b.get()).get();  // the first succeeds
  try {
    files.write(0, 0, 1024, b.get()).get();
    ADD_FAILURE() << "the second write did not fail";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("mpiformer-offload.rank0.adam_m"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("write"), std::string::npos) << e.what();
  }
  ::unsetenv("MPIFORMER_FAULT_OFFLOAD_WRITE");
}

}  // namespace
}  // namespace mpiformer::test
