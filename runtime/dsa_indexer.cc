#include "runtime/dsa_indexer.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "model/spec.h"

namespace kforge {

absl::StatusOr<std::unique_ptr<DsaIndexerModule>> DsaIndexerModule::Load(
    const v1::KernelArtifact& artifact, CUdevice device) {
  if (!artifact.spec().has_dsa_indexer() || !artifact.has_indexer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(artifact.module_name(), ": not a DSA indexer module (kind ",
                     KindCaseName(artifact.spec()), "); SparseMlaDecode loads attention"));
  }
  const v1::IndexerLaunch& launch = artifact.indexer();
  absl::StatusOr<std::unique_ptr<KernelModule>> loaded =
      KernelModule::Load(artifact, kDsaIndexerEntryParams, device);
  if (!loaded.ok()) return loaded.status();
  std::unique_ptr<DsaIndexerModule> m(new DsaIndexerModule(*std::move(loaded)));
  m->spec_ = artifact.spec().dsa_indexer();
  m->launch_ = launch;
  const KernelModule& module = *m->module_;
  for (auto [entry, kernel, smem] :
       {std::tuple{&launch.logits_entry(), &m->logits_, launch.logits_smem_bytes()},
        std::tuple{&launch.topk_entry(), &m->topk_, launch.topk_smem_bytes()},
        std::tuple{&launch.topk_cluster().entry(), &m->topk_cluster_,
                   launch.topk_cluster().smem_bytes()}}) {
    if (entry->empty() && kernel == &m->topk_cluster_) continue;  // before sm_90
    absl::StatusOr<CUkernel> k = module.Entry(*entry);
    if (!k.ok()) return k.status();
    *kernel = *k;
    if (smem > 48 * 1024) {  // above 48 KB a kernel opts in, per device
      if (absl::Status s = module.SetMaxDynamicSmem(*kernel, *entry, smem, device); !s.ok()) {
        return s;
      }
    }
  }
  return m;
}

template <typename Params>
absl::Status DsaIndexerModule::Launch(CUkernel kernel, const IndexerKernelLaunch<Params>& l,
                                      CUstream stream) const {
  // cuLaunchKernel copies the parameter block; the const_cast never writes.
  void* params = const_cast<Params*>(&l.params);
  LaunchDims d;
  d.grid_x = l.grid_x;
  d.grid_y = l.grid_y;
  d.grid_z = l.grid_z;
  d.block_threads = l.block_threads;
  d.dynamic_smem_bytes = l.dynamic_smem_bytes;
  d.programmatic = l.programmatic;
  return module_->Launch(kernel, l.entry, params, d, stream);
}

absl::Status DsaIndexerModule::Logits(const IndexerLogitsArgs& args, CUstream stream) const {
  absl::StatusOr<IndexerKernelLaunch<dsa_indexer::LogitsParams>> l =
      PlanIndexerLogits(spec_, launch_, args);
  if (!l.ok()) return l.status();
  return Launch(logits_, *l, stream);
}

absl::Status DsaIndexerModule::Topk(const IndexerTopkArgs& args, CUstream stream) const {
  absl::StatusOr<IndexerKernelLaunch<dsa_indexer::TopkParams>> l =
      PlanIndexerTopk(spec_, launch_, args);
  if (!l.ok()) return l.status();
  return Launch(l->entry == launch_.topk_entry() ? topk_ : topk_cluster_, *l, stream);
}

}  // namespace kforge
