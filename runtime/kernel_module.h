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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

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

// A cubin loaded as a context-independent CUlibrary: usable in every
// context of the process, on the device it was checked for. The driver
// keeps its own copy of the cubin. Thread-safe after Load.
class KernelModule {
 public:
  // CheckEntryParams, a non-empty cubin, the device's compute capability
  // against artifact.arch (so a wrong-arch kernel fails with a readable
  // message instead of CUDA_ERROR_NO_BINARY_FOR_GPU); then loads the cubin
  // and resolves every listed entry.
  static absl::StatusOr<std::unique_ptr<KernelModule>> Load(const v1::KernelArtifact& artifact,
                                                            absl::Span<const EntryParams> expected,
                                                            CUdevice device);
  ~KernelModule();  // cuLibraryUnload
  KernelModule(const KernelModule&) = delete;
  KernelModule& operator=(const KernelModule&) = delete;

  // The entry named `name`; FailedPrecondition naming the module when the
  // artifact lists no such entry.
  absl::StatusOr<CUkernel> Entry(std::string_view name) const;

  // Opts `entry` into `bytes` of dynamic shared memory on `device` (a
  // kernel needs it above 48 KB).
  absl::Status SetMaxDynamicSmem(CUkernel kernel, std::string_view entry, uint32_t bytes,
                                 CUdevice device) const;

  // Enqueues `kernel` with one by-value parameter block on `stream`, in
  // the stream's context; errors name the module, entry, grid and block.
  absl::Status Launch(CUkernel kernel, std::string_view entry, void* params, const LaunchDims& d,
                      CUstream stream) const;

  const CudaDriver& driver() const { return cu_; }
  const std::string& module_name() const { return module_name_; }

 private:
  KernelModule(const CudaDriver& cu, std::string module_name)
      : cu_(cu), module_name_(std::move(module_name)) {}

  const CudaDriver& cu_;
  std::string module_name_;
  CUlibrary library_ = nullptr;
  std::map<std::string, CUkernel, std::less<>> entries_;
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_KERNEL_MODULE_H_
