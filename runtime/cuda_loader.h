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
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {

// CheckDeviceArch and ArchForComputeCapability: model/arch.h.

// OK when the cubin's parameter blocks, as read back from its ELF
// (artifact.cubin_info) and as recorded by the compiler (params_bytes,
// combine_params_bytes), match the structs this loader passes. A mismatch
// means the kernel and this runtime disagree on the layout of
// templates/kforge/sparse_mla/common/params.h; launching would corrupt memory.
absl::Status CheckParamSizes(const v1::KernelArtifact& artifact);

// A launch configuration (grid in blocks, block in threads).
struct LaunchDims {
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block_threads = 0;
  uint32_t dynamic_smem_bytes = 0;
  // With programmatic stream serialization (Selection::programmatic).
  bool programmatic = false;
};

// Launches `kernel` (a CUkernel of a loaded library, in the stream's
// context) with its by-value parameter array; cuLaunchKernelEx with
// programmatic stream serialization where d.programmatic.
CUresult LaunchWithDims(const CudaDriver& cu, CUkernel kernel, void** args, const LaunchDims& d,
                        CUstream stream);

// One artifact's cubin loaded as a context-independent CUlibrary: usable in
// every context of the process, on the device it was checked for. The
// driver keeps its own copy of the cubin. Thread-safe after Load.
class CudaKernelModule {
 public:
  // Checks the device's compute capability against artifact.arch (first,
  // so a wrong-arch kernel fails with a readable message instead of
  // CUDA_ERROR_NO_BINARY_FOR_GPU), the parameter sizes, and the dynamic
  // shared memory against the device's opt-in limit; then loads the cubin,
  // finds both entries and opts the main kernel into its dynamic shared
  // memory on `device`.
  static absl::StatusOr<std::unique_ptr<CudaKernelModule>> Load(const v1::KernelArtifact& artifact,
                                                                CUdevice device);
  ~CudaKernelModule();  // cuLibraryUnload
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

  const std::string& module_name() const { return module_name_; }
  const std::string& key() const { return key_; }

 private:
  CudaKernelModule(const CudaDriver& cu, std::string module_name, std::string key)
      : cu_(cu), module_name_(std::move(module_name)), key_(std::move(key)) {}
  absl::Status Launch(CUkernel kernel, std::string_view entry, void* params, const LaunchDims& dims,
                      CUstream stream) const;

  const CudaDriver& cu_;
  std::string module_name_;
  std::string key_;
  absl::StatusOr<int> ClustersOf(CUkernel kernel, const std::string& entry,
                                 const LaunchDims& one_cluster) const;

  std::string main_entry_, combine_entry_, small_entry_, cluster_entry_, main_cluster_entry_,
      wide_cluster_entry_;
  LaunchDims cluster_dims_;       // one cluster of the cluster entry
  LaunchDims wide_cluster_dims_;  // one cluster of the wide cluster entry
  CUlibrary library_ = nullptr;
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
