#ifndef KFORGE_BUNDLE_BUNDLE_H_
#define KFORGE_BUNDLE_BUNDLE_H_

// A bundle is a directory of prebuilt kernels and manifests that an engine
// can use with no server (`kforge prebuild` writes one, `kforge verify`
// checks one, `kforge serve --warm-from` loads one, ServiceClient can keep
// its local copy as one). Layout, format version 3:
//
//   DIR/kforge-bundle.json     {"format": "kforge-bundle", "format_version": 3}
//   DIR/release.json           optional: {"sequence": N}, the bundle's place
//                              in its publisher's releases (`kforge prebuild
//                              --sequence N`); listed in checksums.sha256, so
//                              a signature covers it. A reader given a
//                              minimum (`--trust-min-sequence`) refuses a
//                              bundle with a lower one or none: an older
//                              bundle signed by the same key (a rollback).
//   DIR/kernels/<key>.kfa      one binary KernelArtifact (cubin inside) per
//                              kernel, named by its cache key
//   DIR/manifests/<name>.json  one Manifest (protobuf JSON) per
//                              (spec, arch); <name> is the module_name of its
//                              first-choice variant (readable and unique:
//                              module names spell out spec and arch)
//   DIR/checksums.sha256       "<sha256 hex>  <path relative to DIR>" per
//                              kernel and manifest file, sorted by path;
//                              `sha256sum -c checksums.sha256` works in DIR
//   DIR/checksums.sha256.sig   optional: the raw 64-byte Ed25519 signature of
//                              checksums.sha256 (`kforge prebuild --sign`);
//                              it covers every listed file through its sum.
//                              A reader given a trust key (`--trust`)
//                              refuses a bundle without a valid one.
//
// Format version 2 is version 3 without release.json: it is still read
// (it has no sequence, so a minimum refuses it), and a writer adding to it
// rewrites its marker as version 3.
//
// Every file is written to a temporary name and renamed (WriteFileAtomic),
// so a killed writer leaves whole files or none; checksums.sha256 is
// rewritten last by Finish(). Same inputs give byte-identical manifests and
// checksums (no timestamps, sorted order, deterministic serialization).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/file_lock.h"
#include "bundle/kernel_source.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "model/format.h"

namespace kforge {

// The bundle layout's own version (the kernels inside carry
// kFormatVersion): 3 added release.json. Version 1 bundles hold kernels of
// format 1 and are refused.
inline constexpr uint32_t kBundleFormatVersion = 3;
inline constexpr uint32_t kOldestReadableBundleFormatVersion = 2;
inline constexpr char kBundleReleaseFile[] = "release.json";
inline constexpr char kBundleMarkerFile[] = "kforge-bundle.json";
inline constexpr char kBundleChecksumsFile[] = "checksums.sha256";
inline constexpr char kBundleSignatureFile[] = "checksums.sha256.sig";

std::string BundleKernelPath(std::string_view key);  // "kernels/<key>.kfa"
// "manifests/<first-choice module_name>.json"; InvalidArgument for a manifest
// with no variants.
absl::StatusOr<std::string> BundleManifestPath(const v1::Manifest& manifest);

// How a BundleWriter shares its directory with other writers, in this or
// other processes (an advisory flock on the directory itself, so nothing
// extra appears in the bundle and a killed writer's lock goes with it).
enum class BundleLocking {
  // `kforge prebuild`: the directory is locked from Open until the writer
  // is destroyed; Open fails at once when another writer holds it.
  kWholeRun,
  // A client's local copy: each Add*/Finish waits for the lock and releases
  // it, so engines on one host can share a local copy directory.
  kPerWrite,
};

// Adds to a bundle directory (created if missing; an existing bundle of
// another format version is refused). Not thread-safe: one BundleWriter is
// used by one thread at a time; writers in other processes are kept apart
// by `locking`.
class BundleWriter {
 public:
  static absl::StatusOr<std::unique_ptr<BundleWriter>> Open(
      const std::string& dir, BundleLocking locking = BundleLocking::kWholeRun);
  ~BundleWriter();
  BundleWriter(const BundleWriter&) = delete;
  BundleWriter& operator=(const BundleWriter&) = delete;

  // True when kernels/<key>.kfa exists, parses, and holds that key with a
  // non-empty cubin (an interrupted earlier run's files count; damaged ones
  // do not and will be rewritten).
  bool HasKernel(std::string_view key) const;
  absl::Status AddKernel(const v1::KernelArtifact& artifact);
  // InvalidArgument for a manifest BundleSource could never find: no
  // variant, an out-of-range first choice, an arch not spelled canonically
  // ("sm_90a", not "90a") or a variant spec that is not normalized.
  absl::Status AddManifest(const v1::Manifest& manifest);
  // Writes release.json with `sequence` (>= 1); Finish then lists it, so
  // that a signature covers it. Without a call an existing release.json
  // stays as it is.
  absl::Status SetSequence(uint64_t sequence);
  // Rewrites checksums.sha256 over every kernel and manifest file (and
  // release.json) now in the directory. A signature of the old list is removed first: it no
  // longer covers the bundle (sign again with Sign).
  absl::Status Finish();
  // Writes checksums.sha256.sig, the Ed25519 signature of checksums.sha256
  // as Finish left it, with `private_key_pem` (base/ed25519.h).
  absl::Status Sign(const std::string& private_key_pem);

  const std::string& dir() const { return dir_; }

 private:
  BundleWriter(std::string dir, int dir_fd, BundleLocking locking)
      : dir_(std::move(dir)), dir_fd_(dir_fd), locking_(locking) {}
  // Holds the directory lock for one write (kPerWrite); no-op for kWholeRun.
  class WriteLock;
  std::string dir_;
  int dir_fd_;  // open on dir_, carries the flock
  BundleLocking locking_;
  std::optional<FileLock> run_lock_;  // kWholeRun: held from Open on
};

// One problem found by VerifyBundle.
struct BundleProblem {
  std::string path;     // relative to the bundle directory
  std::string message;  // what is wrong
};

// Checks a bundle: marker and format version, every checksum, files present
// but not listed and listed but missing, every kernel parses and its key
// matches its name, every manifest parses, is one AddManifest takes (so
// BundleSource can find it) and each variant's kernel is present and passes
// CheckArtifactForVariant. Empty = good: BundleSource opens the bundle and
// serves every manifest and variant in it (fuzz/bundle_fuzzer.cc checks).
// With `trust_key_file` (an Ed25519 public key, PEM), checksums.sha256 must
// also carry a valid signature by that key (CheckBundleSignature); with
// `min_sequence` > 0 (which needs a trust key), release.json must hold a
// sequence at least that (CheckBundleSequence).
std::vector<BundleProblem> VerifyBundle(const std::string& dir,
                                        const std::string& trust_key_file = "",
                                        uint64_t min_sequence = 0);

// The sequence of the bundle in `dir` from its release.json, checked
// against `checksums_text` (the list the caller read and checked the
// signature of); nullopt when the bundle has none. DataLoss when the file
// is unlisted, damaged or not {"sequence": N}.
absl::StatusOr<std::optional<uint64_t>> ReadBundleSequence(const std::string& dir,
                                                           const std::string& checksums_text);

// The one rollback rule of every reader: OK when the bundle's sequence is
// at least `min_sequence`; FailedPrecondition saying which it has (or that
// it has none) and why it is refused otherwise. `min_sequence` 0: OK.
absl::Status CheckBundleSequence(const std::string& dir, const std::string& checksums_text,
                                 uint64_t min_sequence);

// The one signature rule of every reader: OK when DIR/checksums.sha256.sig
// is the signature of `checksums_text` (the list as the caller read it, so
// that what is checked is what is used) by the public key in
// `trust_key_file`. A missing signature, a signature by another key and a
// list changed after signing are Unauthenticated naming the bundle; a key
// file that cannot be read or is not an Ed25519 public key is
// InvalidArgument naming it.
absl::Status CheckBundleSignature(const std::string& dir, const std::string& checksums_text,
                                  const std::string& trust_key_file);

// Reads kernels and manifests from a bundle directory with no server. Open
// checks the marker and format version and reads the manifests (DataLoss
// for one AddManifest would refuse); kernels are
// read on demand and checked against the checksum list and the variant.
// With `trust_key_file`, Open refuses a bundle that is not signed by that
// key (CheckBundleSignature), before reading anything the list names; with
// `min_sequence` > 0 too (it needs a trust key), one whose sequence is
// lower or missing (CheckBundleSequence).
class BundleSource : public KernelSource {
 public:
  static absl::StatusOr<std::unique_ptr<BundleSource>> Open(const std::string& dir,
                                                            const std::string& trust_key_file = "",
                                                            uint64_t min_sequence = 0);

  // NotFound lists what the bundle holds when (spec, arch) is not there.
  absl::StatusOr<v1::Manifest> GetManifest(const v1::KernelSelector& kernel,
                                           std::string_view arch) override;
  absl::StatusOr<ArtifactRef> GetKernel(const v1::ManifestVariant& variant,
                                        std::string_view arch) override;

  const std::vector<v1::Manifest>& manifests() const;
  // release.json's sequence; nullopt when the bundle has none.
  std::optional<uint64_t> sequence() const;
  // Files and links in the directory that the checksum list does not name
  // (besides the marker, the list and its signature), as relative paths:
  // what `kforge verify` reports as "present but not listed". Found by
  // listing the directory; nothing is read. A server warming from the
  // bundle refuses one (engines sharing a local copy may see a writer's
  // new kernel before its list).
  std::vector<std::string> UnlistedFiles() const;

 private:
  BundleSource() = default;
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_BUNDLE_BUNDLE_H_
