#include "service/memory_cache.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "compiler/key.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

std::string TestKey(int i) { return Sha256Hex("memory-cache-" + std::to_string(i)); }

ArtifactPtr MakeArtifact(const std::string& key, size_t cubin_bytes, uint64_t seed = 1) {
  return ::kforge::testing::FakeArtifact(key, cubin_bytes, seed);
}

TEST(MemoryCacheTest, MissIsNotFound) {
  MemoryCache cache(1 << 20);
  EXPECT_EQ(cache.Get(TestKey(0)).status().code(), absl::StatusCode::kNotFound);
}

TEST(MemoryCacheTest, HitReturnsIdenticalArtifact) {
  MemoryCache cache(1 << 20);
  const ArtifactPtr artifact = MakeArtifact(TestKey(0), 4096);
  ASSERT_TRUE(cache.Put(TestKey(0), artifact).ok());
  absl::StatusOr<ArtifactPtr> got = cache.Get(TestKey(0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->SerializeAsString(), artifact->SerializeAsString());
  const CacheUsage usage = cache.Usage();
  EXPECT_EQ(usage.entries, 1u);
  EXPECT_EQ(usage.bytes, artifact->ByteSizeLong());
}

TEST(MemoryCacheTest, RejectsMismatchedKeyAndNull) {
  MemoryCache cache(1 << 20);
  EXPECT_EQ(cache.Put(TestKey(1), MakeArtifact(TestKey(0), 16)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(TestKey(0), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Usage().entries, 0u);
}

TEST(MemoryCacheTest, PutSameKeyTwiceCountsOnce) {
  MemoryCache cache(1 << 20);
  const ArtifactPtr artifact = MakeArtifact(TestKey(0), 4096);
  ASSERT_TRUE(cache.Put(TestKey(0), artifact).ok());
  ASSERT_TRUE(cache.Put(TestKey(0), artifact).ok());
  EXPECT_EQ(cache.Usage().entries, 1u);
  EXPECT_EQ(cache.Usage().bytes, artifact->ByteSizeLong());
}

TEST(MemoryCacheTest, EvictsLeastRecentlyUsedByBytes) {
  const ArtifactPtr a = MakeArtifact(TestKey(0), 10000);
  const ArtifactPtr b = MakeArtifact(TestKey(1), 10000);
  const ArtifactPtr c = MakeArtifact(TestKey(2), 10000);
  const ArtifactPtr d = MakeArtifact(TestKey(3), 10000);
  const uint64_t each = a->ByteSizeLong();
  MemoryCache cache(3 * each + each / 2);  // room for three
  ASSERT_TRUE(cache.Put(TestKey(0), a).ok());
  ASSERT_TRUE(cache.Put(TestKey(1), b).ok());
  ASSERT_TRUE(cache.Put(TestKey(2), c).ok());
  ASSERT_TRUE(cache.Get(TestKey(0)).ok());  // a is now newer than b
  ASSERT_TRUE(cache.Put(TestKey(3), d).ok());

  EXPECT_TRUE(cache.Get(TestKey(0)).ok());
  EXPECT_EQ(cache.Get(TestKey(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache.Get(TestKey(2)).ok());
  EXPECT_TRUE(cache.Get(TestKey(3)).ok());
  const CacheUsage usage = cache.Usage();
  EXPECT_EQ(usage.entries, 3u);
  EXPECT_EQ(usage.bytes, 3 * each);
  EXPECT_EQ(usage.evictions, 1u);
}

TEST(MemoryCacheTest, OversizedEntryIsNotKept) {
  MemoryCache cache(1000);
  ASSERT_TRUE(cache.Put(TestKey(0), MakeArtifact(TestKey(0), 100)).ok());
  EXPECT_TRUE(cache.Put(TestKey(1), MakeArtifact(TestKey(1), 5000)).ok());
  EXPECT_EQ(cache.Get(TestKey(1)).status().code(), absl::StatusCode::kNotFound);
  // It evicted nothing on its way out.
  EXPECT_TRUE(cache.Get(TestKey(0)).ok());
  EXPECT_EQ(cache.Usage().entries, 1u);
  EXPECT_EQ(cache.Usage().evictions, 0u);
}

TEST(MemoryCacheTest, ConcurrentPutGet) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  std::vector<ArtifactPtr> artifacts;
  for (int i = 0; i <= kThreads; ++i) {
    artifacts.push_back(MakeArtifact(TestKey(i), 2048, i));
  }
  // Room for about half of them, so eviction runs concurrently too.
  MemoryCache cache(artifacts[0]->ByteSizeLong() * (kThreads / 2));
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (int i : {0, t + 1}) {  // one shared key, one own key
          if (!cache.Put(TestKey(i), artifacts[i]).ok()) ++failures[t];
          absl::StatusOr<ArtifactPtr> got = cache.Get(TestKey(i));
          if (got.ok()) {
            if ((*got)->cubin() != artifacts[i]->cubin()) ++failures[t];
          } else if (got.status().code() != absl::StatusCode::kNotFound) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  const CacheUsage usage = cache.Usage();
  EXPECT_LE(usage.bytes, artifacts[0]->ByteSizeLong() * (kThreads / 2));
  EXPECT_EQ(usage.bytes, usage.entries * artifacts[0]->ByteSizeLong());
}

}  // namespace
}  // namespace kforge
