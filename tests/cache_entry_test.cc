// The stored-kernel envelope (service/cache_entry.h) on its own: what a
// reader with and without the fleet key accepts, and that every damaged,
// moved, relabelled or forged entry is refused with the status that says
// which (DataLoss: damaged; Unauthenticated: not the fleet key's;
// PermissionDenied: an origin the reader refuses).
#include "service/cache_entry.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::FakeArtifact;
using ::kforge::testing::TempDir;

const std::string kKey(64, 'a');
const std::string kFleetKey = "0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr size_t kHeaderBytes = 128;  // cache_entry.cc's layout

EntryTrust Keyed(const std::string& key = kFleetKey) {
  EntryTrust trust;
  trust.fleet_key = key;
  return trust;
}

std::string Entry(EntryOrigin origin, const EntryTrust& trust, const std::string& key = kKey) {
  absl::StatusOr<std::string> entry = EncodeCacheEntry(*FakeArtifact(key, 3000), origin, trust);
  EXPECT_TRUE(entry.ok()) << entry.status();
  return entry.ok() ? *entry : "";
}

TEST(CacheEntryTest, RoundTripsWithAndWithoutAFleetKeyAndRecordsTheOrigin) {
  for (const EntryTrust& trust : {EntryTrust{}, Keyed()}) {
    for (EntryOrigin origin :
         {EntryOrigin::kCompiled, EntryOrigin::kSignedBundle, EntryOrigin::kUnsignedBundle}) {
      absl::StatusOr<DecodedEntry> got = DecodeCacheEntry(Entry(origin, trust), kKey, trust);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->origin, origin);
      EXPECT_EQ(got->authenticated, !trust.fleet_key.empty());
      EXPECT_EQ(got->artifact.SerializeAsString(), FakeArtifact(kKey, 3000)->SerializeAsString());
    }
  }
}

TEST(CacheEntryTest, AReaderTakesOnlyEntriesSealedAsItWouldSealThem) {
  const absl::StatusOr<DecodedEntry> unsealed =
      DecodeCacheEntry(Entry(EntryOrigin::kCompiled, {}), kKey, Keyed());
  EXPECT_TRUE(absl::IsUnauthenticated(unsealed.status())) << unsealed.status();
  EXPECT_TRUE(IsUntrustedEntry(unsealed.status()));
  const absl::StatusOr<DecodedEntry> other =
      DecodeCacheEntry(Entry(EntryOrigin::kCompiled, Keyed(std::string(40, 'z'))), kKey, Keyed());
  EXPECT_TRUE(absl::IsUnauthenticated(other.status())) << other.status();
  // Without a key a reader cannot check a MAC: a sealed entry is refused too.
  const absl::StatusOr<DecodedEntry> sealed =
      DecodeCacheEntry(Entry(EntryOrigin::kCompiled, Keyed()), kKey, {});
  EXPECT_TRUE(absl::IsUnauthenticated(sealed.status())) << sealed.status();
}

TEST(CacheEntryTest, EveryByteChangedIsRefusedByAKeyedReader) {
  const std::string good = Entry(EntryOrigin::kCompiled, Keyed());
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    const absl::StatusOr<DecodedEntry> got = DecodeCacheEntry(bad, kKey, Keyed());
    EXPECT_FALSE(got.ok()) << "byte " << i << " changed and still accepted";
  }
  // Without the key, the same for an unsealed entry.
  const std::string plain = Entry(EntryOrigin::kCompiled, {});
  for (size_t i = 0; i < plain.size(); ++i) {
    std::string bad = plain;
    bad[i] ^= 0x20;
    EXPECT_FALSE(DecodeCacheEntry(bad, kKey, {}).ok()) << "byte " << i;
  }
}

TEST(CacheEntryTest, EveryTruncationAndAnyTrailingByteIsDamage) {
  const std::string good = Entry(EntryOrigin::kCompiled, Keyed());
  for (size_t n = 0; n < good.size(); n += (n < kHeaderBytes + 8 ? 1 : 97)) {
    const absl::StatusOr<DecodedEntry> got = DecodeCacheEntry(good.substr(0, n), kKey, Keyed());
    EXPECT_TRUE(absl::IsDataLoss(got.status())) << n << ": " << got.status();
  }
  EXPECT_TRUE(absl::IsDataLoss(DecodeCacheEntry(good + "x", kKey, Keyed()).status()));
}

TEST(CacheEntryTest, AnEntryMovedToAnotherKeyIsRefusedEvenWithAValidMac) {
  // Sealed by a fleet member for key b...b, then stored under a...a.
  const std::string other_key(64, 'b');
  const absl::StatusOr<DecodedEntry> got =
      DecodeCacheEntry(Entry(EntryOrigin::kCompiled, Keyed(), other_key), kKey, Keyed());
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_TRUE(testing::Contains(got.status().message(), "stored for key " + other_key));
}

TEST(CacheEntryTest, UnsignedBundlesEntriesAreRefusedWhereOnlySignedOnesAreTrusted) {
  EntryTrust trust = Keyed();
  trust.signed_bundles_only = true;
  const absl::StatusOr<DecodedEntry> unsigned_bundle =
      DecodeCacheEntry(Entry(EntryOrigin::kUnsignedBundle, Keyed()), kKey, trust);
  EXPECT_TRUE(absl::IsPermissionDenied(unsigned_bundle.status())) << unsigned_bundle.status();
  EXPECT_TRUE(DecodeCacheEntry(Entry(EntryOrigin::kSignedBundle, Keyed()), kKey, trust).ok());
  EXPECT_TRUE(DecodeCacheEntry(Entry(EntryOrigin::kCompiled, Keyed()), kKey, trust).ok());
}

TEST(CacheEntryTest, AnArtifactWithoutACacheKeyIsNotEncoded) {
  EXPECT_FALSE(EncodeCacheEntry(*FakeArtifact("../x", 10), EntryOrigin::kCompiled, {}).ok());
}

TEST(CacheEntryTest, FleetKeyFileIsStrippedAndBounded) {
  TempDir dir("kforge_cache_entry_test");
  const std::filesystem::path path = dir.path() / "fleet.key";
  std::ofstream(path) << "  " << kFleetKey << "\n";
  absl::StatusOr<std::string> key = ReadFleetKeyFile(path.string());
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kFleetKey);
  std::ofstream(path, std::ios::trunc) << std::string(kMinFleetKeyBytes - 1, 'k') << "\n";
  key = ReadFleetKeyFile(path.string());
  EXPECT_TRUE(absl::IsInvalidArgument(key.status())) << key.status();
  EXPECT_TRUE(testing::Contains(key.status().message(), "--fleet-key"));
  std::ofstream(path, std::ios::trunc) << std::string(kMaxFleetKeyBytes + 1, 'k');
  EXPECT_FALSE(ReadFleetKeyFile(path.string()).ok());
  EXPECT_FALSE(ReadFleetKeyFile((dir.path() / "missing").string()).ok());
}

}  // namespace
}  // namespace kforge
