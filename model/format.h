#ifndef KFORGE_MODEL_FORMAT_H_
#define KFORGE_MODEL_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace kforge {

// Version of everything kforge stores or sends about a kernel: the artifact
// layout, the manifest and the cache-key recipe (the bundle directory's
// layout has its own, kBundleFormatVersion in bundle/bundle.h). Bumped
// on any change to them, so that an old cache entry is a miss and an old
// bundle is refused with a message naming both versions.
//   1: first release.
//   2: s_q left the kernel identity (key, module name, manifest variants);
//      the key holds NVRTC's full build identity; readable scale in module
//      names; cubins inspected without LLVM.
//   3: an artifact and a manifest variant list their entries with roles
//      (KernelEntry); the DSA indexer's no longer fill main_entry,
//      combine_entry and the parameter sizes meant for sparse MLA. Older
//      artifacts are refused (CheckArtifactForVariant).
//   4: the spec of an artifact, a manifest variant and a compile job is a
//      KernelSpec (one message per kind) instead of the flat AttentionSpec
//      with a kind; the key hashes the KernelSpec.
//   5: a module is several cubin images (KernelArtifact.more_cubins, each
//      kernel's CubinInfo image), its entries compiled as separate programs
//      in parallel; the key hashes the split.
inline constexpr int kFormatVersion = 5;

// The largest file of each kind kforge reads. Sizes are judged before
// reading (base/io.h OpenRegularFile), so a huge or endless file (a link to
// /dev/zero) is an error naming it, not an allocation failure. An artifact
// holds a cubin (a few MB for the big tilings) and its description; the
// bound matches the largest answer a server sends.
inline constexpr uint64_t kMaxArtifactFileBytes = uint64_t{256} << 20;
// The largest cubin a server serves or a client accepts: the biggest
// modules are a few MB, and a Redis value is capped at 64 MB.
inline constexpr uint64_t kMaxCubinBytes = uint64_t{64} << 20;
// The most cubin images one artifact holds (a module compiled as programs,
// compiler/unit.h: at most one per entry); kMaxCubinBytes bounds them all.
inline constexpr size_t kMaxCubinImages = 16;
inline constexpr uint64_t kMaxManifestFileBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxChecksumsFileBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxMarkerFileBytes = uint64_t{64} << 10;
// A spec is under 1 KB, the default matrix under 1 KB.
inline constexpr uint64_t kMaxSpecFileBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxMatrixFileBytes = uint64_t{1} << 20;

}  // namespace kforge

#endif  // KFORGE_MODEL_FORMAT_H_
