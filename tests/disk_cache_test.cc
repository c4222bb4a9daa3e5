#include "service/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "compiler/key.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kLarge = uint64_t{1} << 30;
// Entry file header: magic, version, lengths, origin, key, SHA-256, MAC.
constexpr size_t kHeaderSize = kCacheEntryHeaderBytes;

std::string TestKey(int i) { return Sha256Hex("disk-cache-" + std::to_string(i)); }

ArtifactPtr MakeArtifact(const std::string& key, size_t cubin_bytes, uint64_t seed = 1) {
  return ::kforge::testing::FakeArtifact(key, cubin_bytes, seed);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void WriteBytes(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// Files under the cache directory, tmp files included.
std::vector<std::string> AllFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().filename().string());
  }
  return out;
}

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("kforge_disk_cache_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<DiskCache> Open(uint64_t max_bytes = kLarge) {
    absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Open(dir_.string(), max_bytes);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  // Get fails as a corrupt entry must: NotFound, file removed, counted; and
  // the key can be stored and read again.
  void ExpectDroppedThenRebuilt(DiskCache& cache, const std::string& key,
                                const ArtifactPtr& artifact) {
    const uint64_t corrupt = cache.Usage().corrupt_entries;
    EXPECT_EQ(cache.Get(key).status().code(), absl::StatusCode::kNotFound);
    EXPECT_FALSE(fs::exists(cache.EntryPath(key)));
    EXPECT_EQ(cache.Usage().corrupt_entries, corrupt + 1);
    ASSERT_TRUE(cache.Put(key, artifact).ok());
    absl::StatusOr<ArtifactPtr> got = cache.Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->SerializeAsString(), artifact->SerializeAsString());
  }

  fs::path dir_;
};

TEST_F(DiskCacheTest, MissIsNotFound) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Get(TestKey(0)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DiskCacheTest, OpenFailsWhereNoDirectoryCanBe) {
  fs::create_directories(dir_);
  WriteBytes((dir_ / "file").string(), "not a directory");
  EXPECT_FALSE(DiskCache::Open((dir_ / "file" / "cache").string(), kLarge).ok());
  EXPECT_EQ(DiskCache::Open("", kLarge).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DiskCacheTest, HitReturnsIdenticalBytes) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  for (size_t size : {size_t{3000}, size_t{2} << 20}) {
    const std::string key = TestKey(static_cast<int>(size));
    const ArtifactPtr artifact = MakeArtifact(key, size);
    ASSERT_TRUE(cache->Put(key, artifact).ok());
    absl::StatusOr<ArtifactPtr> got = cache->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->SerializeAsString(), artifact->SerializeAsString());
  }
  const CacheUsage usage = cache->Usage();
  EXPECT_EQ(usage.entries, 2u);
  EXPECT_GT(usage.bytes, (size_t{2} << 20) + 3000);
  EXPECT_EQ(usage.corrupt_entries, 0u);
}

TEST_F(DiskCacheTest, EntryPathLayout) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string key = TestKey(0);
  EXPECT_EQ(cache->EntryPath(key), (dir_ / "v1" / key.substr(0, 2) / (key + ".kfa")).string());
  ASSERT_TRUE(cache->Put(key, MakeArtifact(key, 100)).ok());
  EXPECT_TRUE(fs::exists(cache->EntryPath(key)));
  EXPECT_EQ(ReadBytes(cache->EntryPath(key)).substr(0, 8), "KFORGE01");
  EXPECT_EQ(AllFiles(dir_.string()).size(), 1u);  // no temporary left behind
}

TEST_F(DiskCacheTest, RejectsBadKeys) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string good = TestKey(0);
  std::string upper = good;
  upper[0] = 'A';
  upper[1] = 'B';
  const std::string bad_keys[] = {
      "",
      "abc",
      good.substr(0, 63),
      good + "0",
      upper,
      "../../../../etc/passwd",
      "ab/" + good.substr(3),
      good.substr(0, 60) + "/../",
      good.substr(0, 63) + "g",
      std::string(64, '\0'),
  };
  for (const std::string& key : bad_keys) {
    SCOPED_TRACE(key);
    EXPECT_EQ(cache->Get(key).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache->Put(key, MakeArtifact(key, 10)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache->EntryPath(key), "");
  }
  EXPECT_TRUE(AllFiles(dir_.string()).empty());
}

TEST_F(DiskCacheTest, PutRejectsMismatchedKeyAndNull) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Put(TestKey(1), MakeArtifact(TestKey(0), 10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Put(TestKey(0), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AllFiles(dir_.string()).empty());
}

TEST_F(DiskCacheTest, ReopenSeesPreviousEntries) {
  CacheUsage before;
  {
    auto cache = Open();
    ASSERT_NE(cache, nullptr);
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(cache->Put(TestKey(i), MakeArtifact(TestKey(i), 5000, i)).ok());
    }
    before = cache->Usage();
  }
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const CacheUsage after = cache->Usage();
  EXPECT_EQ(after.entries, 5u);
  EXPECT_EQ(after.bytes, before.bytes);
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<ArtifactPtr> got = cache->Get(TestKey(i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->cubin(), MakeArtifact(TestKey(i), 5000, i)->cubin());
  }
}

TEST_F(DiskCacheTest, PutSameKeyTwiceCountsOnce) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const ArtifactPtr artifact = MakeArtifact(TestKey(0), 1000);
  ASSERT_TRUE(cache->Put(TestKey(0), artifact).ok());
  const CacheUsage once = cache->Usage();
  ASSERT_TRUE(cache->Put(TestKey(0), artifact).ok());
  EXPECT_EQ(cache->Usage().entries, 1u);
  EXPECT_EQ(cache->Usage().bytes, once.bytes);
}

TEST_F(DiskCacheTest, EvictsLeastRecentlyUsedByBytes) {
  uint64_t each;
  {
    auto probe = Open();
    ASSERT_NE(probe, nullptr);
    ASSERT_TRUE(probe->Put(TestKey(0), MakeArtifact(TestKey(0), 10000)).ok());
    each = probe->Usage().bytes;
  }
  fs::remove_all(dir_);
  auto cache = Open(3 * each + each / 2);  // room for three
  ASSERT_NE(cache, nullptr);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache->Put(TestKey(i), MakeArtifact(TestKey(i), 10000, i)).ok());
  }
  ASSERT_TRUE(cache->Get(TestKey(0)).ok());  // 0 is now newer than 1
  ASSERT_TRUE(cache->Put(TestKey(3), MakeArtifact(TestKey(3), 10000, 3)).ok());

  EXPECT_FALSE(fs::exists(cache->EntryPath(TestKey(1))));
  EXPECT_EQ(cache->Get(TestKey(1)).status().code(), absl::StatusCode::kNotFound);
  for (int i : {0, 2, 3}) EXPECT_TRUE(cache->Get(TestKey(i)).ok()) << i;
  CacheUsage usage = cache->Usage();
  EXPECT_EQ(usage.entries, 3u);
  EXPECT_EQ(usage.bytes, 3 * each);
  EXPECT_EQ(usage.evictions, 1u);
  EXPECT_EQ(usage.corrupt_entries, 0u);

  // The order survives a restart: it lives in the files' mtimes. Now 0, 2, 3
  // were read in that order, so 0 goes next.
  cache = Open(3 * each + each / 2);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Put(TestKey(4), MakeArtifact(TestKey(4), 10000, 4)).ok());
  EXPECT_FALSE(fs::exists(cache->EntryPath(TestKey(0))));
  for (int i : {2, 3, 4}) EXPECT_TRUE(fs::exists(cache->EntryPath(TestKey(i))));
}

TEST_F(DiskCacheTest, OversizedEntryIsNotKept) {
  auto cache = Open(4096);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Put(TestKey(0), MakeArtifact(TestKey(0), 100)).ok());
  EXPECT_TRUE(cache->Put(TestKey(1), MakeArtifact(TestKey(1), 10000)).ok());
  EXPECT_FALSE(fs::exists(cache->EntryPath(TestKey(1))));
  EXPECT_TRUE(cache->Get(TestKey(0)).ok());
  EXPECT_EQ(cache->Usage().entries, 1u);
  EXPECT_EQ(cache->Usage().evictions, 0u);
}

TEST_F(DiskCacheTest, FlippedByteAnywhereIsDropped) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string key = TestKey(0);
  const ArtifactPtr artifact = MakeArtifact(key, 4000);
  ASSERT_TRUE(cache->Put(key, artifact).ok());
  const std::string good = ReadBytes(cache->EntryPath(key));
  ASSERT_GT(good.size(), kHeaderSize + 4000);

  // Every header byte (magic, version, origin, key, digest, MAC), then a spread of
  // payload bytes: the artifact's description fields, the cubin, the end.
  std::vector<size_t> offsets;
  for (size_t i = 0; i < kHeaderSize; ++i) offsets.push_back(i);
  for (size_t i = kHeaderSize; i < good.size(); i += 397) offsets.push_back(i);
  offsets.push_back(good.size() - 1);
  uint64_t corrupt = 0;
  for (size_t offset : offsets) {
    SCOPED_TRACE(offset);
    std::string bad = good;
    bad[offset] ^= 0x01;
    WriteBytes(cache->EntryPath(key), bad);
    ExpectDroppedThenRebuilt(*cache, key, artifact);
    EXPECT_EQ(cache->Usage().corrupt_entries, ++corrupt);
  }
  EXPECT_EQ(cache->Usage().entries, 1u);
  EXPECT_EQ(cache->Usage().bytes, good.size());
}

// A directory others can write (shared by servers, or planted in): with a
// fleet key, an entry not sealed with it is dropped, counted as untrusted,
// and never served; --trust drops entries that came from unsigned bundles.
TEST_F(DiskCacheTest, EntriesNotSealedWithTheFleetKeyOrFromUnsignedBundlesAreDropped) {
  EntryTrust keyed;
  keyed.fleet_key = std::string(40, 'k');
  absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Open(dir_.string(), kLarge, keyed);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EntryTrust other_key;
  other_key.fleet_key = std::string(40, 'o');
  const std::string key = TestKey(0);
  const ArtifactPtr artifact = MakeArtifact(key, 4000);
  uint64_t untrusted = 0;
  for (const EntryTrust& writer : {EntryTrust{}, other_key}) {
    absl::StatusOr<std::unique_ptr<DiskCache>> planter =
        DiskCache::Open(dir_.string(), kLarge, writer);
    ASSERT_TRUE(planter.ok()) << planter.status();
    ASSERT_TRUE((*planter)->Put(key, artifact).ok());
    ASSERT_TRUE((*planter)->Get(key).ok());  // whole: only the key tells
    ExpectDroppedThenRebuilt(**cache, key, artifact);
    EXPECT_EQ((*cache)->Usage().untrusted_entries, ++untrusted);
    ASSERT_TRUE(fs::remove((*cache)->EntryPath(key)));
  }

  EntryTrust trusted = keyed;
  trusted.signed_bundles_only = true;
  absl::StatusOr<std::unique_ptr<DiskCache>> strict =
      DiskCache::Open(dir_.string(), kLarge, trusted);
  ASSERT_TRUE(strict.ok()) << strict.status();
  ASSERT_TRUE((*cache)->PutFrom(key, artifact, EntryOrigin::kUnsignedBundle).ok());
  ASSERT_TRUE((*cache)->Get(key).ok());
  EXPECT_TRUE(absl::IsNotFound((*strict)->Get(key).status()));
  EXPECT_FALSE(fs::exists((*strict)->EntryPath(key)));
  EXPECT_EQ((*strict)->Usage().untrusted_entries, 1u);
  ASSERT_TRUE((*cache)->PutFrom(key, artifact, EntryOrigin::kSignedBundle).ok());
  EXPECT_TRUE((*strict)->Get(key).ok());
}

// Drop: what the server calls when an entry decodes but is not the kernel
// asked for.
TEST_F(DiskCacheTest, DropRemovesTheEntryAndCountsIt) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string key = TestKey(0);
  ASSERT_TRUE(cache->Put(key, MakeArtifact(key, 100)).ok());
  const absl::Status dropped = cache->Drop(key, absl::DataLossError("not an ELF"));
  EXPECT_TRUE(absl::IsNotFound(dropped)) << dropped;
  EXPECT_FALSE(fs::exists(cache->EntryPath(key)));
  const CacheUsage usage = cache->Usage();
  EXPECT_EQ(usage.corrupt_entries, 1u);
  EXPECT_EQ(usage.untrusted_entries, 0u);
  EXPECT_EQ(usage.entries, 0u);
}

TEST_F(DiskCacheTest, TruncatedOrExtendedIsDropped) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string key = TestKey(0);
  const ArtifactPtr artifact = MakeArtifact(key, 4000);
  ASSERT_TRUE(cache->Put(key, artifact).ok());
  const std::string good = ReadBytes(cache->EntryPath(key));

  for (size_t length :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{12}, size_t{44}, kHeaderSize - 1,
        kHeaderSize, kHeaderSize + 1, good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE(length);
    WriteBytes(cache->EntryPath(key), good.substr(0, length));
    ExpectDroppedThenRebuilt(*cache, key, artifact);
  }
  SCOPED_TRACE("trailing byte");
  WriteBytes(cache->EntryPath(key), good + "x");
  ExpectDroppedThenRebuilt(*cache, key, artifact);
}

TEST_F(DiskCacheTest, AnotherKeysEntryIsDropped) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const ArtifactPtr a = MakeArtifact(TestKey(0), 3000, 1);
  const ArtifactPtr b = MakeArtifact(TestKey(1), 3000, 2);
  ASSERT_TRUE(cache->Put(TestKey(0), a).ok());
  ASSERT_TRUE(cache->Put(TestKey(1), b).ok());
  // A whole, internally valid entry under the wrong name.
  fs::copy_file(cache->EntryPath(TestKey(1)), cache->EntryPath(TestKey(0)),
                fs::copy_options::overwrite_existing);
  ExpectDroppedThenRebuilt(*cache, TestKey(0), a);
  // The entry it was copied from is untouched.
  absl::StatusOr<ArtifactPtr> got = cache->Get(TestKey(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->cubin(), b->cubin());
}

TEST_F(DiskCacheTest, StaleTemporaryFilesRemovedAtOpen) {
  const std::string key = TestKey(0);
  std::string entry_path;
  {
    auto cache = Open();
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->Put(key, MakeArtifact(key, 2000)).ok());
    entry_path = cache->EntryPath(key);
  }
  // What killed writers leave: complete or partial files under temporary
  // names. One is old (its writer is long dead), one fresh (a live writer in
  // another process may be about to rename it).
  const std::string stale = entry_path + ".tmp.12345.00112233aabbccdd";
  const std::string fresh = entry_path + ".tmp.12346.8899aabbccddeeff";
  fs::rename(entry_path, stale);
  WriteBytes(fresh, "KFORGE01 partial");
  const timespec old_time = {time(nullptr) - 3600, 0};
  const timespec times[2] = {old_time, old_time};
  ASSERT_EQ(utimensat(AT_FDCWD, stale.c_str(), times, 0), 0);

  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_EQ(cache->Usage().entries, 0u);
  EXPECT_EQ(cache->Usage().bytes, 0u);
  EXPECT_EQ(cache->Get(key).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache->Usage().corrupt_entries, 0u);
  EXPECT_TRUE(fs::exists(fresh));
}

TEST_F(DiskCacheTest, TemporaryFilesAreNeverEvictedAsEntries) {
  const std::string key = TestKey(0);
  auto cache = Open(20000);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Put(key, MakeArtifact(key, 2000)).ok());
  const std::string fresh = cache->EntryPath(key) + ".tmp.1.0";
  WriteBytes(fresh, std::string(100, 'x'));
  for (int i = 1; i < 20; ++i) {
    ASSERT_TRUE(cache->Put(TestKey(i), MakeArtifact(TestKey(i), 2000, i)).ok());
  }
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_LE(cache->Usage().bytes, 20000u);
  EXPECT_GT(cache->Usage().evictions, 0u);
}

TEST_F(DiskCacheTest, ConcurrentThreadsSameAndDifferentKeys) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 30;
  std::vector<ArtifactPtr> artifacts;
  for (int i = 0; i <= kThreads; ++i) {
    artifacts.push_back(MakeArtifact(TestKey(i), 20000, i));
  }
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (int i : {0, t + 1}) {  // one shared key, one own key
          if (!cache->Put(TestKey(i), artifacts[i]).ok()) ++failures[t];
          absl::StatusOr<ArtifactPtr> got = cache->Get(TestKey(i));
          if (!got.ok() || (*got)->cubin() != artifacts[i]->cubin()) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  const CacheUsage usage = cache->Usage();
  EXPECT_EQ(usage.entries, kThreads + 1u);
  EXPECT_EQ(usage.corrupt_entries, 0u);
  EXPECT_EQ(AllFiles(dir_.string()).size(), kThreads + 1u);
}

TEST_F(DiskCacheTest, ConcurrentThreadsUnderEviction) {
  constexpr int kThreads = 8;
  constexpr int kKeys = 24;
  std::vector<ArtifactPtr> artifacts;
  for (int i = 0; i < kKeys; ++i) {
    artifacts.push_back(MakeArtifact(TestKey(i), 8000, i));
  }
  auto cache = Open(6 * 8200);  // about six entries
  ASSERT_NE(cache, nullptr);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 40; ++r) {
        const int i = (t * 7 + r * 5) % kKeys;
        if (!cache->Put(TestKey(i), artifacts[i]).ok()) ++failures[t];
        const int j = (t + r) % kKeys;
        absl::StatusOr<ArtifactPtr> got = cache->Get(TestKey(j));
        if (got.ok() ? (*got)->cubin() != artifacts[j]->cubin()
                     : got.status().code() != absl::StatusCode::kNotFound) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(cache->Usage().corrupt_entries, 0u);
  EXPECT_GT(cache->Usage().evictions, 0u);
}

// Runs `body` in a child process (a fresh DiskCache over the same
// directory, like another replica) and returns its exit code. gtest
// assertions do not cross fork, so the child reports by exit code.
template <typename Body>
pid_t ForkChild(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

int WaitChild(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(DiskCacheTest, TwoProcessesPutSameKey) {
  const std::string key = TestKey(0);
  const ArtifactPtr artifact = MakeArtifact(key, 1 << 20);
  // Both wait on a pipe so their Puts start together.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  auto worker = [&]() -> int {
    char c;
    if (read(go[0], &c, 1) != 1) return 10;
    absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Open(dir_.string(), kLarge);
    if (!cache.ok()) return 11;
    for (int r = 0; r < 20; ++r) {
      if (!(*cache)->Put(key, artifact).ok()) return 12;
      absl::StatusOr<ArtifactPtr> got = (*cache)->Get(key);
      if (!got.ok()) return 13;
      if ((*got)->SerializeAsString() != artifact->SerializeAsString()) {
        return 14;
      }
    }
    return (*cache)->Usage().corrupt_entries == 0 ? 0 : 15;
  };
  const pid_t a = ForkChild(worker);
  const pid_t b = ForkChild(worker);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  ASSERT_EQ(write(go[1], "xx", 2), 2);
  close(go[0]);
  close(go[1]);
  EXPECT_EQ(WaitChild(a), 0);
  EXPECT_EQ(WaitChild(b), 0);

  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  absl::StatusOr<ArtifactPtr> got = cache->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->SerializeAsString(), artifact->SerializeAsString());
  EXPECT_EQ(AllFiles(dir_.string()), std::vector<std::string>{key + ".kfa"});  // one file, no tmp
}

TEST_F(DiskCacheTest, TwoProcessesEvictingEachOther) {
  constexpr int kKeys = 16;
  auto worker = [&](int seed) -> int {
    absl::StatusOr<std::unique_ptr<DiskCache>> cache =
        DiskCache::Open(dir_.string(), 5 * 8200);  // about five entries
    if (!cache.ok()) return 11;
    for (int r = 0; r < 60; ++r) {
      const int i = (seed * 3 + r * 7) % kKeys;
      if (!(*cache)->Put(TestKey(i), MakeArtifact(TestKey(i), 8000, i)).ok()) {
        return 12;
      }
      const int j = (seed + r) % kKeys;
      absl::StatusOr<ArtifactPtr> got = (*cache)->Get(TestKey(j));
      if (got.ok()) {
        if ((*got)->cubin() != MakeArtifact(TestKey(j), 8000, j)->cubin()) {
          return 13;
        }
      } else if (got.status().code() != absl::StatusCode::kNotFound) {
        return 14;
      }
    }
    return (*cache)->Usage().corrupt_entries == 0 ? 0 : 15;
  };
  const pid_t a = ForkChild([&] { return worker(1); });
  const pid_t b = ForkChild([&] { return worker(2); });
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  EXPECT_EQ(WaitChild(a), 0);
  EXPECT_EQ(WaitChild(b), 0);
  // Each process evicts to the cap after its own Put, so the directory ends
  // within the cap plus at most the other's one in-flight entry.
  auto cache = Open(5 * 8200);
  ASSERT_NE(cache, nullptr);
  EXPECT_LE(cache->Usage().bytes, 6u * 8200);
}

}  // namespace
}  // namespace kforge
