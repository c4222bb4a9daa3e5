#ifndef KFORGE_RUNTIME_KERNEL_MODULE_H_
#define KFORGE_RUNTIME_KERNEL_MODULE_H_

// One kernel module (an artifact's cubin) loaded with the CUDA Driver API,
// whatever its family: every entry the artifact lists (KernelArtifact.
// entries) resolved by name, each checked to take the parameter block its
// family's runtime passes for its role. Each family's runtime holds one
// and adds its own launch rules; nothing here knows a kind
// (tests/layering_test.sh keeps it so).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cuda.h"
#include "kforge/v1/artifact.pb.h"
#include "runtime/cuda_driver.h"

namespace kforge {

// The parameter block a runtime passes to the entries of one role.
struct EntryParams {
  v1::EntryRole role;
  size_t bytes;             // sizeof the host struct
  const char* struct_name;  // the struct's name, for messages
  const char* defined_in;   // the header that defines it, for messages
};

// OK when the artifact lists its entries (format 3 and later) and every
// one has a role in `expected` and takes that role's block, both as the
// compiler recorded it (KernelEntry.params_bytes) and as the cubin's ELF
// says (cubin_info). FailedPrecondition for an artifact without entries
// (an older kforge's), a role this runtime does not launch, or another
// block size (kernel and runtime built from different templates);
// DataLoss when cubin_info lacks a listed entry.
absl::Status CheckEntryParams(const v1::KernelArtifact& artifact,
                              absl::Span<const EntryParams> expected);

// An attribute of `device`; errors name `what` and the device.
absl::StatusOr<int> DeviceAttribute(const CudaDriver& cu, CUdevice device,
                                    CUdevice_attribute attribute, std::string_view what);

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

// A module's cubin images (KernelArtifact.cubin and more_cubins) loaded as
// context-independent CUlibraries, one each: usable in every
// context of the process, on the device it was checked for. The driver
// keeps its own copy of the cubin (cuLibraryLoadData without
// CU_LIBRARY_BINARY_IS_PRESERVED), so the artifact may go once loaded.
// Thread-safe after Load. The C ABI's KforgeModule (capi/kforge_capi.h)
// is one of these, so the Python package loads through it too.
class KernelModule {
 public:
  // One entry the artifact lists (KernelArtifact.entries), resolved.
  struct ModuleEntry {
    std::string name;
    CUkernel kernel = nullptr;
    size_t params_bytes = 0;  // the block its role takes (EntryParams.bytes)
  };

  // CheckEntryParams, a non-empty cubin, the device's compute capability
  // against artifact.arch (so a wrong-arch kernel fails with a readable
  // message instead of CUDA_ERROR_NO_BINARY_FOR_GPU); then loads the cubin
  // and resolves every listed entry. The checks that need no device come
  // first, so a bad artifact is refused the same way on a machine with no
  // driver; there, a good one is a FailedPrecondition that starts
  // "loading kforge kernels needs the CUDA driver".
  static absl::StatusOr<std::unique_ptr<KernelModule>> Load(const v1::KernelArtifact& artifact,
                                                            absl::Span<const EntryParams> expected,
                                                            CUdevice device);
  // The same for the device of CUDA ordinal `device_ordinal` (cuDeviceGet).
  static absl::StatusOr<std::unique_ptr<KernelModule>> LoadOnOrdinal(
      const v1::KernelArtifact& artifact, absl::Span<const EntryParams> expected,
      int device_ordinal);
  ~KernelModule();  // cuLibraryUnload
  KernelModule(const KernelModule&) = delete;
  KernelModule& operator=(const KernelModule&) = delete;

  // The entry named `name`; FailedPrecondition naming the module when the
  // artifact lists no such entry.
  absl::StatusOr<CUkernel> Entry(std::string_view name) const;
  // Its index in entries(); the same error.
  absl::StatusOr<size_t> EntryIndex(std::string_view name) const;
  // Every listed entry, in the artifact's order.
  const std::vector<ModuleEntry>& entries() const { return entries_; }

  // Opts `entry` into `bytes` of dynamic shared memory on `device` (a
  // kernel needs it above 48 KB).
  absl::Status SetMaxDynamicSmem(CUkernel kernel, std::string_view entry, uint32_t bytes,
                                 CUdevice device) const;

  // Lets `kernel` launch clusters past the portable 8 CTAs on `device`
  // (its cluster size is compiled in); an error where the device refuses,
  // and then none of its clusters can launch.
  absl::Status AllowNonPortableCluster(CUkernel kernel, std::string_view entry,
                                       CUdevice device) const;

  // How many clusters of `kernel` the device runs at once for a launch of
  // `one_cluster` (grid = one cluster; block, dynamic smem):
  // cuOccupancyMaxActiveClusters, 0 where the driver cannot say. Resolves
  // the kernel in the context current on the calling thread
  // (cuKernelGetFunction), an error without one.
  absl::StatusOr<int> MaxActiveClusters(CUkernel kernel, std::string_view entry,
                                        const LaunchDims& one_cluster) const;

  // Loads every entry into the context current on the calling thread
  // (cuKernelGetFunction), so that its first launch there does not load it
  // lazily (CUDA_MODULE_LOADING=LAZY), e.g. inside a CUDA graph capture; an
  // error without a current context. Launches need no such call.
  absl::Status LoadIntoCurrentContext() const;

  // Enqueues `kernel` with one by-value parameter block on `stream`, in
  // the stream's context; errors name the module, entry, grid and block.
  absl::Status Launch(CUkernel kernel, std::string_view entry, void* params, const LaunchDims& d,
                      CUstream stream) const;

  const CudaDriver& driver() const { return cu_; }
  const std::string& module_name() const { return module_name_; }
  // The device it was checked for and loaded on.
  CUdevice device() const { return device_; }

 private:
  KernelModule(const CudaDriver& cu, std::string module_name, CUdevice device)
      : cu_(cu), module_name_(std::move(module_name)), device_(device) {}

  // The checks Load makes before it needs a driver, then the driver.
  static absl::StatusOr<const CudaDriver*> CheckLoadable(const v1::KernelArtifact& artifact,
                                                         absl::Span<const EntryParams> expected);
  static absl::StatusOr<std::unique_ptr<KernelModule>> LoadChecked(
      const CudaDriver& cu, const v1::KernelArtifact& artifact,
      absl::Span<const EntryParams> expected, CUdevice device);

  const CudaDriver& cu_;
  std::string module_name_;
  CUdevice device_;
  std::vector<CUlibrary> libraries_;  // one per cubin image
  std::vector<ModuleEntry> entries_;
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_KERNEL_MODULE_H_
