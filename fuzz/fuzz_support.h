#ifndef KFORGE_FUZZ_FUZZ_SUPPORT_H_
#define KFORGE_FUZZ_FUZZ_SUPPORT_H_

// What the libFuzzer targets of fuzz/ share with one another and with the
// seed tool (make_seeds.cc): property checks, a scratch directory, and the
// byte layouts of the inputs that are more than one file (a bundle) or pick a
// mode (a disk-cache entry). Each layout is encoded and decoded here only.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/message.h"

namespace kforge::fuzz {

// A property of the code under test does not hold for this input: prints
// `what` and aborts, which libFuzzer reports as a crash and keeps the input.
[[noreturn]] void Fail(std::string_view what);
inline void Check(bool holds, std::string_view what) {
  if (!holds) Fail(what);
}

// Field-by-field equality in which a NaN equals a NaN (a float field can
// hold one, and a message is still the same message).
bool SameMessage(const google::protobuf::Message& a, const google::protobuf::Message& b);

// An empty directory of this process under $TMPDIR (made on first use,
// removed at exit), for the targets whose code under test reads files.
const std::string& ScratchDir();
// Removes everything inside `dir`, keeping `dir`.
void EmptyDir(const std::string& dir);
// Writes a file, creating its parent directories; false when it cannot.
bool WriteFile(const std::string& path, std::string_view contents);
void WriteFileOrDie(const std::string& path, std::string_view contents);

// ---------------------------------------------------------------------------
// Bundle archive: a bundle directory as one input.
//
//   byte 0          flags; bit 0: after writing the files, write
//                   checksums.sha256 over every kernel and manifest file
//                   (sha256sum's format), as someone planting files would,
//                   so that what lies behind the checksums is reached
//   then, until the input ends, entries:
//     byte          kind (modulo kBundleEntryKinds)
//     byte n, n bytes   name
//     4 bytes LE m, m bytes   contents (m clamped to what is left)
//
// Kinds and where an entry is written in the bundle directory:
//   0 kforge-bundle.json, 1 checksums.sha256, 2 manifests/<name>.json,
//   3 kernels/<name>.kfa, 4 <name> (top level). A name keeps only
//   [A-Za-z0-9_.-] (others become '_', a leading '.' too); an empty manifest
//   or kernel name is taken from the contents where they parse (the
//   manifest's path per BundleManifestPath, the artifact's key), else "_".
enum class BundleEntryKind : uint8_t { kMarker, kChecksums, kManifest, kKernel, kOther };
inline constexpr int kBundleEntryKinds = 5;

struct BundleEntry {
  BundleEntryKind kind = BundleEntryKind::kOther;
  std::string name;
  std::string contents;
};

struct BundleArchive {
  bool write_checksums = false;
  std::vector<BundleEntry> entries;
};

std::string EncodeBundleArchive(const BundleArchive& archive);
// Never fails: any bytes are some archive.
BundleArchive DecodeBundleArchive(std::string_view bytes);
// Writes the archive's files into `dir` (existing and empty). A later entry
// for the same path replaces an earlier one; a path that cannot exist beside
// the others (a file where a directory must be) is left out.
void WriteBundleArchive(const BundleArchive& archive, const std::string& dir);

// ---------------------------------------------------------------------------
// Disk-cache input: byte 0 picks the mode, the rest is its data.
//   bit 0 clear: the data is an entry file, placed where DiskCache keeps the
//                entry of kDiskFuzzKey, then read with DiskCache::Get.
//   bit 0 set:   the data is a serialized KernelArtifact; where it parses, it
//                is stored under kDiskFuzzKey with DiskCache::Put (its key
//                set to that), then read back with Get.
inline constexpr char kDiskFuzzKey[] =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
inline constexpr uint8_t kDiskModePut = 1;

// ---------------------------------------------------------------------------
// Cache-entry input (cache_entry_fuzzer.cc): byte 0 picks the reader, the
// rest is the entry, read for kDiskFuzzKey.
inline constexpr uint8_t kEntryFuzzKeyed = 1;       // the reader has the fleet key
inline constexpr uint8_t kEntryFuzzReseal = 2;      // the MAC is recomputed first
inline constexpr uint8_t kEntryFuzzSignedOnly = 4;  // unsigned bundles refused
inline constexpr char kEntryFuzzFleetKey[] = "fuzz-fleet-key-0123456789abcdef0123456789";

// ---------------------------------------------------------------------------
// Server answer input: what a client gets back for one kernel, as one input.
//   4 bytes LE n, then n bytes (clamped to what is left): the GetManifest
//   answer (a serialized Manifest); the rest: the GetKernel answer (a
//   serialized GetKernelResponse).
struct ServerAnswer {
  std::string manifest;
  std::string kernel;
};

std::string EncodeServerAnswer(const ServerAnswer& answer);
// Never fails: any bytes are some answer.
ServerAnswer DecodeServerAnswer(std::string_view bytes);

}  // namespace kforge::fuzz

#endif  // KFORGE_FUZZ_FUZZ_SUPPORT_H_
