#ifndef KFORGE_COMPILER_INDEXER_CODEGEN_H_
#define KFORGE_COMPILER_INDEXER_CODEGEN_H_

#include <string>

#include "compiler/unit.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"

namespace kforge {

// Entry points of every DSA indexer module (extern "C").
inline constexpr char kIndexerLogitsEntry[] = "dsa_indexer_logits";
inline constexpr char kIndexerTopkEntry[] = "dsa_indexer_topk";
// sm_90+ only: the top-k over a cluster of CTAs per row (config.h).
inline constexpr char kIndexerTopkClusterEntry[] = "dsa_indexer_topk_cluster";

// Whether `arch` runs thread-block clusters (sm_90 and later), so its
// modules carry the top-k cluster entry.
bool IndexerHasTopkCluster(const Arch& arch);
// Whether the logits entry uses warpgroup MMA (sm_90a).
bool IndexerLogitsWgmma(const Arch& arch);

// Readable, deterministic name from every kernel-changing parameter of a
// valid indexer spec, e.g. dsa_indexer_h32_d128_topk2048_pb64_sm120a.
std::string IndexerModuleName(const v1::DsaIndexerSpec& spec, const Arch& arch);

// The instantiation unit: one IndexerTraits with the spec's numbers and the
// extern "C" entries (templates/kforge/dsa_indexer/): logits, top-k, and
// the top-k cluster entry where `arch` has clusters.
GeneratedUnit GenerateIndexerSource(const v1::DsaIndexerSpec& spec, const Arch& arch);

// The launch of both kernels (config.h's rules), entries and parameter
// block sizes included.
v1::IndexerLaunch MakeIndexerLaunch(const v1::DsaIndexerSpec& spec, const Arch& arch);

}  // namespace kforge

#endif  // KFORGE_COMPILER_INDEXER_CODEGEN_H_
