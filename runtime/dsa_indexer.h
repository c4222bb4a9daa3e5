#ifndef KFORGE_RUNTIME_DSA_INDEXER_H_
#define KFORGE_RUNTIME_DSA_INDEXER_H_

// The DSA lightning indexer for a C++ engine: one indexer module
// (ATTENTION_KIND_DSA_INDEXER, from `kforge compile --kind dsa-indexer`, a
// server or a bundle) loaded with the Driver API, and its two kernels
// launched on the caller's stream with the plans model/indexer_plan.h makes.
// Launches never synchronize or allocate, so they can be captured in a CUDA
// graph.

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda.h"
#include "kforge/v1/artifact.pb.h"
#include "model/indexer_plan.h"
#include "runtime/kernel_module.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {

// The parameter blocks the indexer's runtime passes, by entry role.
inline constexpr EntryParams kDsaIndexerEntryParams[] = {
    {v1::ENTRY_ROLE_INDEXER_LOGITS, sizeof(dsa_indexer::LogitsParams), "LogitsParams",
     "templates/kforge/dsa_indexer/config.h"},
    {v1::ENTRY_ROLE_INDEXER_TOPK, sizeof(dsa_indexer::TopkParams), "TopkParams",
     "templates/kforge/dsa_indexer/config.h"},
};

class DsaIndexerModule {
 public:
  // Checks the artifact is an indexer module, then loads it
  // (KernelModule::Load with kDsaIndexerEntryParams: parameter blocks of
  // this build's config.h, the device's compute capability against its
  // arch) and finds the entries its launch names (logits, top-k, and the
  // top-k cluster entry where it has one).
  static absl::StatusOr<std::unique_ptr<DsaIndexerModule>> Load(const v1::KernelArtifact& artifact,
                                                                CUdevice device);
  DsaIndexerModule(const DsaIndexerModule&) = delete;
  DsaIndexerModule& operator=(const DsaIndexerModule&) = delete;

  // Enqueue the logits kernel / the top-k kernel on `stream`; argument
  // errors are PlanIndexerLogits's / PlanIndexerTopk's.
  absl::Status Logits(const IndexerLogitsArgs& args, CUstream stream) const;
  absl::Status Topk(const IndexerTopkArgs& args, CUstream stream) const;

  const v1::DsaIndexerSpec& spec() const { return spec_; }
  const std::string& module_name() const { return module_->module_name(); }

 private:
  explicit DsaIndexerModule(std::unique_ptr<KernelModule> module) : module_(std::move(module)) {}
  template <typename Params>
  absl::Status Launch(CUkernel kernel, const IndexerKernelLaunch<Params>& l, CUstream stream) const;

  std::unique_ptr<KernelModule> module_;
  v1::DsaIndexerSpec spec_;
  v1::IndexerLaunch launch_;
  CUkernel logits_ = nullptr;
  CUkernel topk_ = nullptr;
  CUkernel topk_cluster_ = nullptr;  // null: the module has no cluster entry
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_DSA_INDEXER_H_
