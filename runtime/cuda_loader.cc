#include "runtime/cuda_loader.h"

#include <algorithm>

#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/absl_compat.h"
#include "model/artifact_check.h"

namespace kforge {
namespace {

absl::Status CheckRecordedSize(const v1::KernelArtifact& artifact, const char* field,
                               uint32_t recorded, size_t want, const char* struct_name) {
  // 0: an artifact from before the field existed; cubin_info still checks.
  if (recorded == 0 || recorded == want) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: %s = %u but this runtime's sizeof(%s) = %u: kernel and runtime were "
                      "built from different templates/kforge/sparse_mla/common/params.h",
                      artifact.module_name(), field, recorded, struct_name, want));
}

}  // namespace

absl::Status CheckParamSizes(const v1::KernelArtifact& artifact) {
  using sparse_mla::CombineParams;
  using sparse_mla::DecodeParams;
  if (absl::Status s = CheckRecordedSize(artifact, "params_bytes", artifact.params_bytes(),
                                         sizeof(DecodeParams), "DecodeParams");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRecordedSize(artifact, "combine_params_bytes", artifact.combine_params_bytes(),
                            sizeof(CombineParams), "CombineParams");
      !s.ok()) {
    return s;
  }
  return CheckEntryParams(artifact, kSparseMlaEntryParams);
}

absl::StatusOr<std::unique_ptr<CudaKernelModule>> CudaKernelModule::Load(
    const v1::KernelArtifact& artifact, CUdevice device) {
  if (absl::Status s = CheckParamSizes(artifact); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<KernelModule>> loaded =
      KernelModule::Load(artifact, kSparseMlaEntryParams, device);
  if (!loaded.ok()) return loaded.status();
  const CudaDriver& cu = (*loaded)->driver();
  absl::StatusOr<int> smem_optin =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                      "max shared memory per block (opt-in)");
  if (!smem_optin.ok()) return smem_optin.status();
  const uint32_t smem = artifact.launch().dynamic_smem_bytes();
  const uint32_t small_smem = artifact.small_batch().launch().dynamic_smem_bytes();
  if (std::max(smem, small_smem) > static_cast<uint32_t>(*smem_optin)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s needs %u bytes of dynamic shared memory per block; this device allows "
                        "%d",
                        artifact.module_name(), std::max(smem, small_smem), *smem_optin));
  }

  std::unique_ptr<CudaKernelModule> module(
      new CudaKernelModule(*std::move(loaded), artifact.key()));
  module->main_entry_ = artifact.main_entry();
  module->combine_entry_ = artifact.combine_entry();
  module->small_entry_ = artifact.small_batch().entry();
  module->cluster_entry_ = artifact.small_batch().cluster_entry();
  module->main_cluster_entry_ = artifact.cluster().entry();
  module->wide_cluster_entry_ = artifact.cluster().wide_entry();
  module->cluster_dims_ = {artifact.small_batch().tiling().num_head_groups(),
                           artifact.small_batch().cluster_splits(), 1,
                           artifact.small_batch().launch().block_threads(), small_smem};
  module->wide_cluster_dims_ = {artifact.tiling().num_head_groups(),
                                artifact.cluster().wide_splits(), 1,
                                artifact.launch().block_threads(), smem};
  const KernelModule& m = *module->module_;
  for (auto [entry, kernel] : {std::pair{&module->main_entry_, &module->main_},
                               std::pair{&module->combine_entry_, &module->combine_},
                               std::pair{&module->small_entry_, &module->small_},
                               std::pair{&module->cluster_entry_, &module->cluster_},
                               std::pair{&module->main_cluster_entry_, &module->main_cluster_},
                               std::pair{&module->wide_cluster_entry_, &module->wide_cluster_}}) {
    if (entry->empty()) continue;  // no small-batch path or cluster entry
    absl::StatusOr<CUkernel> k = m.Entry(*entry);
    if (!k.ok()) return k.status();
    *kernel = *k;
  }
  // Above 48 KB a kernel must opt into its dynamic shared memory, per device.
  for (auto [kernel, entry, bytes] :
       {std::tuple{module->main_, &module->main_entry_, smem},
        std::tuple{module->small_, &module->small_entry_, small_smem},
        std::tuple{module->cluster_, &module->cluster_entry_, small_smem},
        std::tuple{module->main_cluster_, &module->main_cluster_entry_, smem},
        std::tuple{module->wide_cluster_, &module->wide_cluster_entry_, smem}}) {
    if (kernel == nullptr) continue;
    if (absl::Status s = m.SetMaxDynamicSmem(kernel, *entry, bytes, device); !s.ok()) return s;
  }
  // Clusters past the portable 8 CTAs (the cluster entry's size is
  // compiled in) launch only once the kernel opts in; a device that refuses
  // runs none of them (MaxActiveClusters answers 0).
  for (auto [kernel, entry] : {std::pair{&module->cluster_, &module->cluster_entry_},
                               std::pair{&module->wide_cluster_, &module->wide_cluster_entry_}}) {
    if (*kernel != nullptr && !m.AllowNonPortableCluster(*kernel, *entry, device).ok()) {
      *kernel = nullptr;
    }
  }
  return module;
}

absl::StatusOr<int> CudaKernelModule::MaxActiveClusters() const {
  // Either entry may be missing or refused; the selector holds one number
  // for both, so a module with both gets the fewer (a device refusing one
  // of them runs neither).
  if ((!cluster_entry_.empty() && cluster_ == nullptr) ||
      (!wide_cluster_entry_.empty() && wide_cluster_ == nullptr)) {
    return 0;
  }
  int fewest = -1;
  for (auto [kernel, entry, dims] :
       {std::tuple{cluster_, &cluster_entry_, &cluster_dims_},
        std::tuple{wide_cluster_, &wide_cluster_entry_, &wide_cluster_dims_}}) {
    if (kernel == nullptr) continue;
    absl::StatusOr<int> clusters = module_->MaxActiveClusters(kernel, *entry, *dims);
    if (!clusters.ok()) return clusters.status();
    fewest = fewest < 0 ? *clusters : std::min(fewest, *clusters);
  }
  return std::max(fewest, 0);
}

absl::Status CudaKernelModule::LaunchMain(const sparse_mla::DecodeParams& params,
                                          const LaunchDims& dims, std::string_view entry,
                                          CUstream stream) const {
  CUkernel kernel = nullptr;
  for (auto [name, k] :
       {std::pair{&main_entry_, main_}, std::pair{&small_entry_, small_},
        std::pair{&cluster_entry_, cluster_}, std::pair{&main_cluster_entry_, main_cluster_},
        std::pair{&wide_cluster_entry_, wide_cluster_}}) {
    if (k != nullptr && *name == entry) kernel = k;
  }
  if (kernel == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(module_name(), " has no main kernel named '",
                                                      AsAbsl(entry), "'; the plan asked for it"));
  }
  // cuLaunchKernel copies the parameter block; the const_cast never writes.
  return module_->Launch(kernel, entry, const_cast<sparse_mla::DecodeParams*>(&params), dims,
                         stream);
}

absl::Status CudaKernelModule::LaunchCombine(const sparse_mla::CombineParams& params,
                                             const LaunchDims& dims, CUstream stream) const {
  return module_->Launch(combine_, combine_entry_, const_cast<sparse_mla::CombineParams*>(&params),
                         dims, stream);
}

}  // namespace kforge
