#ifndef KFORGE_RUNTIME_CUDA_LOADER_H_
#define KFORGE_RUNTIME_CUDA_LOADER_H_

// Loads a kforge kernel artifact (one cubin with the sparse MLA main and
// combine entry points) with the CUDA Driver API and launches its kernels.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda.h"
#include "kforge/v1/artifact.pb.h"
#include "model/arch.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_module.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {

// CheckDeviceArch and ArchForComputeCapability: model/arch.h.

// The parameter blocks the sparse MLA runtime passes, by entry role.
inline constexpr EntryParams kSparseMlaEntryParams[] = {
    {v1::ENTRY_ROLE_ATTENTION, sizeof(sparse_mla::DecodeParams), "DecodeParams",
     "templates/kforge/sparse_mla/common/params.h"},
    {v1::ENTRY_ROLE_COMBINE, sizeof(sparse_mla::CombineParams), "CombineParams",
     "templates/kforge/sparse_mla/common/params.h"},
};

// OK when the cubin's parameter blocks, as read back from its ELF
// (artifact.cubin_info) and as recorded by the compiler (params_bytes,
// combine_params_bytes, entries), match the structs this loader passes
// (CheckEntryParams with kSparseMlaEntryParams). A mismatch means the
// kernel and this runtime disagree on the layout of
// templates/kforge/sparse_mla/common/params.h; launching would corrupt
// memory.
absl::Status CheckParamSizes(const v1::KernelArtifact& artifact);

// One sparse MLA artifact's cubin (KernelModule) with its launch rules:
// which entry is the combine, each main entry's dynamic shared memory and
// cluster shape. Thread-safe after Load.
class CudaKernelModule {
 public:
  // Loads the module (KernelModule::Load: parameter sizes, the device's
  // compute capability against artifact.arch), checks the dynamic shared
  // memory against the device's opt-in limit, finds the entries the
  // artifact names and opts the main kernels into their dynamic shared
  // memory on `device`.
  static absl::StatusOr<std::unique_ptr<CudaKernelModule>> Load(const v1::KernelArtifact& artifact,
                                                                CUdevice device);
  CudaKernelModule(const CudaKernelModule&) = delete;
  CudaKernelModule& operator=(const CudaKernelModule&) = delete;

  // Enqueue one kernel on `stream`, in the stream's context (the current
  // context for the null stream). Errors name the module and entry.
  // entry: the main kernel the plan names (Selection::main_entry): the
  // throughput one or its cluster entries (v1::ClusterPath), or the
  // small-batch path's (v1::SmallBatchPath) entry or cluster entry;
  // FailedPrecondition if the module has no such kernel.
  absl::Status LaunchMain(const sparse_mla::DecodeParams& params, const LaunchDims& dims,
                          std::string_view entry, CUstream stream) const;
  absl::Status LaunchCombine(const sparse_mla::CombineParams& params, const LaunchDims& dims,
                             CUstream stream) const;

  // How many clusters of the module's non-portable cluster entries (the
  // small-batch path's cluster entry, the throughput tiling's wide one) the
  // device runs at once, the fewer of the two where it has both
  // (cuOccupancyMaxActiveClusters; the selector's
  // DeviceInfo::max_active_clusters); 0 without such an entry. Needs the
  // module's context current.
  absl::StatusOr<int> MaxActiveClusters() const;

  const std::string& module_name() const { return module_->module_name(); }
  const std::string& key() const { return key_; }

 private:
  CudaKernelModule(std::unique_ptr<KernelModule> module, std::string key)
      : module_(std::move(module)), key_(std::move(key)) {}

  std::unique_ptr<KernelModule> module_;
  std::string key_;

  std::string main_entry_, combine_entry_, small_entry_, cluster_entry_, main_cluster_entry_,
      wide_cluster_entry_;
  LaunchDims cluster_dims_;       // one cluster of the cluster entry
  LaunchDims wide_cluster_dims_;  // one cluster of the wide cluster entry
  CUkernel main_ = nullptr;
  CUkernel combine_ = nullptr;
  CUkernel small_ = nullptr;         // null without a small-batch path
  CUkernel cluster_ = nullptr;       // null without its cluster entry, or where the
                                     // device refused its cluster size
  CUkernel main_cluster_ = nullptr;  // the throughput tiling's (v1::ClusterPath)
  CUkernel wide_cluster_ = nullptr;  // its wide one; null without it, or where the
                                     // device refused its cluster size
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_CUDA_LOADER_H_
