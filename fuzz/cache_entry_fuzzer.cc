// The stored-kernel envelope (service/cache_entry.h) as a disk or Redis
// read meets it: DecodeCacheEntry on hostile bytes. Byte 0 of the input
// picks the reader, the rest is the entry:
//   bit 0 (kEntryFuzzKeyed)  the reader has the fleet key kEntryFuzzFleetKey
//   bit 1 (kEntryFuzzReseal) the entry's MAC is recomputed with that key
//                            first (when it has a header), so that mutations
//                            reach what the MAC guards
//   bit 2 (kEntryFuzzSignedOnly) the reader refuses unsigned bundles' entries
// Beyond no crash, UB or leak:
//   - a refusal is DataLoss, Unauthenticated or PermissionDenied (only
//     where unsigned bundles are refused);
//   - an accepted entry holds kDiskFuzzKey, says whether its MAC was checked
//     (exactly when the reader is keyed), is refused by a reader with
//     another key (a keyed reader) or with none (an unkeyed one), and
//     encodes again to an entry that decodes to the same artifact and
//     origin.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "fuzz/fuzz_support.h"
#include "service/cache_entry.h"

namespace {

using kforge::DecodedEntry;
using kforge::EntryOrigin;
using kforge::EntryTrust;
using kforge::fuzz::Check;
using kforge::fuzz::kDiskFuzzKey;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string entry(reinterpret_cast<const char*>(data) + 1, size - 1);
  EntryTrust trust;
  if ((mode & kforge::fuzz::kEntryFuzzKeyed) != 0) {
    trust.fleet_key = kforge::fuzz::kEntryFuzzFleetKey;
  }
  trust.signed_bundles_only = (mode & kforge::fuzz::kEntryFuzzSignedOnly) != 0;
  if ((mode & kforge::fuzz::kEntryFuzzReseal) != 0 &&
      entry.size() >= kforge::kCacheEntryHeaderBytes) {
    entry.replace(kforge::kCacheEntryMacAt,
                  kforge::kCacheEntryHeaderBytes - kforge::kCacheEntryMacAt,
                  kforge::HmacSha256(kforge::fuzz::kEntryFuzzFleetKey,
                                     std::string_view(entry).substr(0, kforge::kCacheEntryMacAt)));
  }

  absl::StatusOr<DecodedEntry> got = kforge::DecodeCacheEntry(entry, kDiskFuzzKey, trust);
  if (!got.ok()) {
    const absl::Status& s = got.status();
    Check(absl::IsDataLoss(s) || absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s),
          absl::StrCat("unexpected refusal: ", s.ToString()));
    Check(!absl::IsPermissionDenied(s) || trust.signed_bundles_only,
          "an origin refused by a reader that refuses none");
    return 0;
  }
  Check(got->artifact.key() == kDiskFuzzKey, "an accepted entry holds another key");
  Check(got->authenticated == !trust.fleet_key.empty(), "authenticated says the wrong thing");
  Check(!trust.signed_bundles_only || got->origin != EntryOrigin::kUnsignedBundle,
        "an unsigned bundle's entry accepted by a reader that refuses them");
  EntryTrust other = trust;
  other.fleet_key = trust.fleet_key.empty() ? std::string(kforge::kMinFleetKeyBytes, 'o') : "";
  Check(absl::IsUnauthenticated(kforge::DecodeCacheEntry(entry, kDiskFuzzKey, other).status()),
        "an entry accepted by a reader set up otherwise (another key, or none)");

  absl::StatusOr<std::string> again = kforge::EncodeCacheEntry(got->artifact, got->origin, trust);
  Check(again.ok(), absl::StrCat("re-encoding: ", again.status().ToString()));
  absl::StatusOr<DecodedEntry> back = kforge::DecodeCacheEntry(*again, kDiskFuzzKey, trust);
  Check(back.ok(), absl::StrCat("decoding a re-encoded entry: ", back.status().ToString()));
  Check(back->origin == got->origin, "re-encoding changed the origin");
  Check(back->artifact.SerializeAsString() == got->artifact.SerializeAsString(),
        "re-encoding changed the artifact");
  return 0;
}
