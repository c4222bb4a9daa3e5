#include "service/cache_entry.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "base/log.h"
#include "base/sha256.h"

namespace kforge {
namespace {

// Entry file layout, all integers little-endian:
//   [0, 8)    magic "KFORGE01"
//   [8, 12)   uint32 entry format version
//   [12, 44)  SHA-256 of the payload
//   [44, 52)  uint64 payload length
//   [52, ..)  payload: serialized v1::KernelArtifact
// Bump kCacheEntryVersion on any change; old entries then read as corrupt
// and are rebuilt.
constexpr std::string_view kMagic = "KFORGE01";
constexpr size_t kHashSize = 32;
constexpr size_t kHeaderSize = 8 + 4 + kHashSize + 8;

void PutLe(uint64_t v, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLe(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  }
  return v;
}

}  // namespace

bool IsLowerHexDigit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool IsValidCacheKey(std::string_view key) {
  return key.size() == 64 && std::all_of(key.begin(), key.end(), IsLowerHexDigit);
}

absl::Status CacheKeyError(std::string_view key) {
  return absl::InvalidArgumentError(
      absl::StrCat("cache key must be 64 lower-case hex digits, got \"",
                   absl::CEscape(AsAbsl(key.substr(0, 80))), "\""));
}

std::string EncodeCacheEntryHeader(std::string_view payload) {
  std::string header;
  header.reserve(kHeaderSize);
  header.append(kMagic);
  PutLe(kCacheEntryVersion, 4, header);
  header.append(absl::HexStringToBytes(AsAbsl(Sha256Hex(payload))));
  PutLe(payload.size(), 8, header);
  return header;
}

absl::StatusOr<v1::KernelArtifact> DecodeCacheEntry(std::string_view file, std::string_view key) {
  if (file.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrCat("truncated header (", file.size(), " bytes)"));
  }
  if (file.substr(0, kMagic.size()) != kMagic) {
    return absl::DataLossError("bad magic");
  }
  const uint64_t version = GetLe(file.substr(8), 4);
  if (version != kCacheEntryVersion) {
    return absl::DataLossError(
        absl::StrCat("entry format version ", version, ", expected ", kCacheEntryVersion));
  }
  const std::string_view hash = file.substr(12, kHashSize);
  const uint64_t length = GetLe(file.substr(12 + kHashSize), 8);
  const std::string_view payload = file.substr(kHeaderSize);
  if (length != payload.size() || length > INT_MAX) {
    return absl::DataLossError(
        absl::StrCat("payload length ", payload.size(), ", header says ", length));
  }
  if (Sha256Hex(payload) != absl::BytesToHexString(AsAbsl(hash))) {
    return absl::DataLossError("payload digest mismatch");
  }
  v1::KernelArtifact artifact;
  if (!artifact.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("payload does not parse");
  }
  if (artifact.key() != key) {
    return absl::DataLossError(absl::StrCat("entry holds key ", artifact.key()));
  }
  return artifact;
}

absl::StatusOr<std::string> EncodeCacheEntry(const v1::KernelArtifact& artifact) {
  std::string payload;
  if (!artifact.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat("cannot serialize artifact ", artifact.key()));
  }
  std::string entry = EncodeCacheEntryHeader(payload);
  entry += payload;
  return entry;
}

absl::Status DroppedCorruptEntry(std::string_view tier, std::string_view key,
                                 std::string_view why) {
  const std::string message = absl::StrCat("dropped corrupt artifact ", AsAbsl(key), " on ",
                                           AsAbsl(tier), ": ", AsAbsl(why));
  LogEvent(LogLevel::kWarning, "corrupt_entry", message, {{"tier", tier}, {"key", key}});
  return absl::NotFoundError(message);
}

}  // namespace kforge
