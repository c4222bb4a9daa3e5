#include "service/cache_entry.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "base/credentials.h"
#include "base/log.h"
#include "base/sha256.h"

namespace kforge {
namespace {

// Entry layout (version 2), all integers little-endian:
//   [0, 8)     magic "KFORGE01"
//   [8, 12)    uint32 entry format version (kCacheEntryVersion)
//   [12, 16)   uint32 header length, 128: the payload starts there
//   [16]       uint8 origin (EntryOrigin)
//   [17]       uint8 MAC kind: 0 none, 1 HMAC-SHA256 with the fleet key
//   [18, 24)   zero
//   [24, 56)   the cache key the entry is stored under, 32 raw bytes
//   [56, 64)   uint64 payload length
//   [64, 96)   SHA-256 of the payload
//   [96, 128)  MAC kind 1: HMAC-SHA256(fleet key, bytes [0, 96)); else zero
//   [128, ..)  payload: serialized v1::KernelArtifact
// The MAC covers the header, which holds the payload's digest, the key and
// the origin: a value moved to another key, relabelled or with another
// payload fails it. Bump kCacheEntryVersion on any change; old entries
// then read as damaged and are rebuilt.
constexpr std::string_view kMagic = "KFORGE01";
constexpr size_t kHashSize = 32;
constexpr size_t kVersionAt = 8;
constexpr size_t kHeaderLengthAt = 12;
constexpr size_t kOriginAt = 16;
constexpr size_t kMacKindAt = 17;
constexpr size_t kReservedAt = 18;
constexpr size_t kKeyAt = 24;
constexpr size_t kLengthAt = 56;
constexpr size_t kDigestAt = 64;
constexpr size_t kMacAt = kCacheEntryMacAt;
constexpr size_t kHeaderSize = kCacheEntryHeaderBytes;
static_assert(kMacAt + kHashSize == kHeaderSize);
constexpr uint8_t kMacNone = 0;
constexpr uint8_t kMacHmacSha256 = 1;

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

bool IsKnownOrigin(uint8_t origin) {
  return origin >= static_cast<uint8_t>(EntryOrigin::kCompiled) &&
         origin <= static_cast<uint8_t>(EntryOrigin::kUnsignedBundle);
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

std::string_view EntryOriginName(EntryOrigin origin) {
  switch (origin) {
    case EntryOrigin::kCompiled:
      return "compiled";
    case EntryOrigin::kSignedBundle:
      return "signed bundle";
    case EntryOrigin::kUnsignedBundle:
      return "unsigned bundle";
  }
  return "unknown";
}

absl::StatusOr<std::string> ReadFleetKeyFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path, "--fleet-key");
  if (!text.ok()) return text.status();
  const std::string key(absl::StripAsciiWhitespace(*text));
  if (key.size() < kMinFleetKeyBytes || key.size() > kMaxFleetKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fleet-key ", path, ": the key is ", key.size(), " bytes, expected ", kMinFleetKeyBytes,
        "..", kMaxFleetKeyBytes, " (`openssl rand -hex 32 > FILE` makes one)"));
  }
  return key;
}

absl::StatusOr<std::string> EncodeCacheEntry(const v1::KernelArtifact& artifact, EntryOrigin origin,
                                             const EntryTrust& trust) {
  if (!IsValidCacheKey(artifact.key())) return CacheKeyError(artifact.key());
  std::string payload;
  if (!artifact.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat("cannot serialize artifact ", artifact.key()));
  }
  const bool sealed = !trust.fleet_key.empty();
  std::string entry;
  entry.reserve(kHeaderSize + payload.size());
  entry.append(kMagic);
  PutLe(kCacheEntryVersion, 4, entry);
  PutLe(kHeaderSize, 4, entry);
  entry.push_back(static_cast<char>(origin));
  entry.push_back(static_cast<char>(sealed ? kMacHmacSha256 : kMacNone));
  entry.append(kKeyAt - kReservedAt, '\0');
  entry.append(absl::HexStringToBytes(AsAbsl(artifact.key())));
  PutLe(payload.size(), 8, entry);
  entry.append(absl::HexStringToBytes(AsAbsl(Sha256Hex(payload))));
  entry.append(sealed ? HmacSha256(trust.fleet_key, entry) : std::string(kHashSize, '\0'));
  entry += payload;
  return entry;
}

absl::StatusOr<DecodedEntry> DecodeCacheEntry(std::string_view entry, std::string_view key,
                                              const EntryTrust& trust) {
  if (entry.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrCat("truncated header (", entry.size(), " bytes)"));
  }
  if (entry.substr(0, kMagic.size()) != kMagic) return absl::DataLossError("bad magic");
  const uint64_t version = GetLe(entry.substr(kVersionAt), 4);
  if (version != kCacheEntryVersion) {
    return absl::DataLossError(
        absl::StrCat("entry format version ", version, ", expected ", kCacheEntryVersion));
  }
  const uint64_t header_size = GetLe(entry.substr(kHeaderLengthAt), 4);
  if (header_size != kHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("header length ", header_size, ", expected ", kHeaderSize));
  }
  const uint8_t origin = static_cast<uint8_t>(entry[kOriginAt]);
  const uint8_t mac_kind = static_cast<uint8_t>(entry[kMacKindAt]);
  if (!IsKnownOrigin(origin)) return absl::DataLossError(absl::StrCat("unknown origin ", origin));
  if (mac_kind != kMacNone && mac_kind != kMacHmacSha256) {
    return absl::DataLossError(absl::StrCat("unknown MAC kind ", mac_kind));
  }
  const std::string_view reserved = entry.substr(kReservedAt, kKeyAt - kReservedAt);
  if (std::any_of(reserved.begin(), reserved.end(), [](char c) { return c != 0; })) {
    return absl::DataLossError("reserved header bytes are not zero");
  }
  const std::string envelope_key =
      absl::BytesToHexString(AsAbsl(entry.substr(kKeyAt, kLengthAt - kKeyAt)));
  if (envelope_key != key) {
    return absl::DataLossError(absl::StrCat("entry is stored for key ", envelope_key));
  }
  const uint64_t length = GetLe(entry.substr(kLengthAt), 8);
  const std::string_view payload = entry.substr(kHeaderSize);
  if (length != payload.size() || length > INT_MAX) {
    return absl::DataLossError(
        absl::StrCat("payload length ", payload.size(), ", header says ", length));
  }
  // The MAC before the digest: an entry from someone without the key is
  // refused as such, whatever else it holds.
  // An entry is read only by a reader set up as its writer was: a sealed
  // entry's MAC cannot be checked without the key, so a reader without one
  // refuses it too (a fleet half on a key shows up in the counters rather
  // than half-trusting each other).
  const std::string_view mac = entry.substr(kMacAt, kHashSize);
  const bool authenticated = !trust.fleet_key.empty();
  if (authenticated) {
    if (mac_kind != kMacHmacSha256) {
      return absl::UnauthenticatedError("entry carries no MAC and a fleet key is configured");
    }
    if (!ConstantTimeEquals(mac, HmacSha256(trust.fleet_key, entry.substr(0, kMacAt)))) {
      return absl::UnauthenticatedError("MAC mismatch: not written with this fleet key");
    }
  } else if (mac_kind != kMacNone) {
    return absl::UnauthenticatedError(
        "entry is sealed with a fleet key and this server has none to check it");
  } else if (std::any_of(mac.begin(), mac.end(), [](char c) { return c != 0; })) {
    return absl::DataLossError("MAC bytes set in an entry without a MAC");
  }
  if (Sha256Hex(payload) !=
      absl::BytesToHexString(AsAbsl(entry.substr(kDigestAt, kMacAt - kDigestAt)))) {
    return absl::DataLossError("payload digest mismatch");
  }
  DecodedEntry out;
  if (!out.artifact.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("payload does not parse");
  }
  if (out.artifact.key() != key) {
    return absl::DataLossError(absl::StrCat(
        "entry holds key ", absl::CHexEscape(AsAbsl(out.artifact.key().substr(0, 80)))));
  }
  out.origin = static_cast<EntryOrigin>(origin);
  out.authenticated = authenticated;
  if (trust.signed_bundles_only && out.origin == EntryOrigin::kUnsignedBundle) {
    return absl::PermissionDeniedError(
        "entry came from an unsigned bundle and this server trusts signed bundles only");
  }
  return out;
}

bool IsUntrustedEntry(const absl::Status& status) {
  return absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
}

absl::Status DroppedCorruptEntry(std::string_view tier, std::string_view key,
                                 const absl::Status& why) {
  const bool untrusted = IsUntrustedEntry(why);
  const std::string message =
      absl::StrCat("dropped ", untrusted ? "untrusted" : "corrupt", " artifact ", AsAbsl(key),
                   " on ", AsAbsl(tier), ": ", why.message());
  LogEvent(LogLevel::kWarning, untrusted ? "untrusted_entry" : "corrupt_entry", message,
           {{"tier", tier}, {"key", key}});
  return absl::NotFoundError(message);
}

}  // namespace kforge
