#ifndef KFORGE_MODEL_ARTIFACT_CHECK_H_
#define KFORGE_MODEL_ARTIFACT_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"

namespace kforge {

// Keys and module names become file names (bundles, local copies, `kforge
// get -o DIR`). The compiler makes both of [0-9a-z_]; the one rule for a name
// read from a server, a bundle or a cache is non-empty [A-Za-z0-9_.-], not
// starting with '.', so that a hostile or damaged name ("../x", "a/b") cannot
// reach outside a directory. InvalidArgument naming `field` and the value
// otherwise.
absl::Status CheckFileStem(std::string_view field, std::string_view name);

// Where an answer's kernel came from, as every tool and counter names it:
// the enum's name less its prefix, lower case ("memory", "disk", "redis",
// "compiled", "shared_compile", "unspecified"); "unknown" for a value this
// build does not know (a newer server's).
std::string ArtifactSourceName(v1::ArtifactSource source);

// The manifest variant a compiled artifact is: its module, key, spec,
// tiling, launch rule and entry names.
v1::ManifestVariant VariantOfArtifact(const v1::KernelArtifact& artifact);

// A module's main kernels beside main_entry that are set, all taking
// DecodeParams: the small-batch path's entry and cluster entry, and the
// throughput tiling's cluster entries. Pointers into `small` and `cluster`.
std::vector<const std::string*> OptionalMainEntries(const v1::SmallBatchPath& small,
                                                    const v1::ClusterPath& cluster);

// The artifact's cubin images: `cubin` (image 0), then `more_cubins`.
inline size_t CubinImageCount(const v1::KernelArtifact& artifact) {
  return 1 + static_cast<size_t>(artifact.more_cubins_size());
}
inline const std::string& ImageOf(const v1::KernelArtifact& artifact, size_t image) {
  return image == 0 ? artifact.cubin() : artifact.more_cubins(static_cast<int>(image - 1));
}
// The bytes of all of them.
uint64_t CubinBytes(const v1::KernelArtifact& artifact);

// The kernel named `name` among `info`'s (an artifact's cubin_info or an
// inspected image's), or null.
const v1::KernelResources* FindKernel(const v1::CubinInfo& info, std::string_view name);

// The entries every first answer of `variant` holds (and so does the whole
// module): the main and combine entries, an indexer's logits and top-k,
// those that are set. Pointers into `variant`.
std::vector<const std::string*> FirstAnswerEntries(const v1::ManifestVariant& variant);

// What a first answer (KernelArtifact.partial) of `variant` is when it holds
// only the entries in `present`: `variant` less the optional paths whose
// entry is not there (the small-batch path, or only its cluster entry; the
// throughput cluster entry and wide entry; an indexer's cluster top-k) and
// less those entries in its list. FirstAnswerEntries are never dropped:
// an answer without them fails the check below. The one rule for what a first answer launches:
// the compiler builds it and clients check it with it.
v1::ManifestVariant FirstAnswerVariant(const v1::ManifestVariant& variant,
                                       const std::vector<std::string>& present);

// OK when `artifact` is the kernel `variant` names for `arch`: module name
// and key usable as file names (CheckFileStem), same key, module, arch,
// entry points and parameter sizes, at most kMaxCubinImages non-empty cubin
// images of at most kMaxCubinBytes in all, each an ELF whose inspected arch
// is `arch`, which together export exactly the entries the artifact names
// (main, combine, the optional main entries and an indexer's cluster
// top-k), each once, from the image its cubin_info record names, with the
// host's parameter size. Otherwise
// DataLoss naming the first mismatch (a server, bundle or cache tier
// answered with something else). The one check of a kernel: clients run it
// on every answer, and the server on every kernel a cache tier hands it,
// against the variant it planned, before serving or copying it.
// A first answer (artifact.partial) is never the whole module: DataLoss.
absl::Status CheckArtifactForVariant(const v1::ManifestVariant& variant, std::string_view arch,
                                     const v1::KernelArtifact& artifact);

// For a client that asked for a first answer: a whole module as
// CheckArtifactForVariant, or a partial one checked the same way against
// FirstAnswerVariant(variant, the entries its images export).
absl::Status CheckAnswerForVariant(const v1::ManifestVariant& variant, std::string_view arch,
                                   const v1::KernelArtifact& artifact, bool accept_partial);

}  // namespace kforge

#endif  // KFORGE_MODEL_ARTIFACT_CHECK_H_
