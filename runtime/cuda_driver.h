#ifndef KFORGE_RUNTIME_CUDA_DRIVER_H_
#define KFORGE_RUNTIME_CUDA_DRIVER_H_

// The CUDA Driver API, loaded at run time. kforge never links libcuda: the
// compile service, the tools and the CPU tests run on machines with no
// NVIDIA driver, and linking the toolkit's stub would make every binary that
// touches the runtime fail to start there. Only the engine-side runtime
// (cuda_loader.h, sparse_mla_decode.h) needs a driver, and it asks for one
// through CudaDriver::Get(), which answers with a clear FailedPrecondition
// when there is none.
//
// Entry points are resolved with cuGetProcAddress at the CUDA 12.0 ABI
// (kCudaApiVersion), so the signatures below are the 12.0 ones even where a
// newer header (CUDA 13 changed cuCtxSynchronize and cuCtxGetDevice) or a
// newer driver has another version of the same name.

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda.h"          // types only: nothing here links against libcuda
#include "cudaTypedefs.h"  // PFN_<name>_v<version> function pointer types

namespace kforge {

// The API version the entry points are resolved at: cuLibrary* (context-
// independent loading) appeared in CUDA 12.0, so 12.0 is also the oldest
// driver the runtime accepts.
inline constexpr int kCudaApiVersion = 12000;

// The library dlopen()ed by CudaDriver::Get().
inline constexpr char kCudaDriverLibrary[] = "libcuda.so.1";

// Function pointers into the driver, named after the function without its
// "cu" prefix (cuMemAlloc -> MemAlloc): the unprefixed names cannot collide
// with cuda.h's version macros (#define cuMemAlloc cuMemAlloc_v2).
struct CudaDriverApi {
  PFN_cuGetErrorName_v6000 GetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 GetErrorString = nullptr;
  PFN_cuInit_v2000 Init = nullptr;
  PFN_cuDriverGetVersion_v2020 DriverGetVersion = nullptr;
  PFN_cuDeviceGet_v2000 DeviceGet = nullptr;
  PFN_cuDeviceGetCount_v2000 DeviceGetCount = nullptr;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute = nullptr;
  PFN_cuDeviceGetName_v2000 DeviceGetName = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease = nullptr;
  PFN_cuCtxGetCurrent_v4000 CtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent_v4000 CtxSetCurrent = nullptr;
  PFN_cuCtxPushCurrent_v4000 CtxPushCurrent = nullptr;
  PFN_cuCtxPopCurrent_v4000 CtxPopCurrent = nullptr;
  PFN_cuCtxSynchronize_v2000 CtxSynchronize = nullptr;
  PFN_cuLibraryLoadData_v12000 LibraryLoadData = nullptr;
  PFN_cuLibraryUnload_v12000 LibraryUnload = nullptr;
  PFN_cuLibraryGetKernel_v12000 LibraryGetKernel = nullptr;
  PFN_cuKernelSetAttribute_v12000 KernelSetAttribute = nullptr;
  PFN_cuKernelGetFunction_v12000 KernelGetFunction = nullptr;
  // How many of a cluster kernel's clusters fit the device at once.
  PFN_cuOccupancyMaxActiveClusters_v11070 OccupancyMaxActiveClusters = nullptr;
  PFN_cuLaunchKernel_v4000 LaunchKernel = nullptr;
  // With the programmatic-stream-serialization attribute (sm_90+).
  PFN_cuLaunchKernelEx_v11060 LaunchKernelEx = nullptr;
  PFN_cuMemAlloc_v3020 MemAlloc = nullptr;
  PFN_cuMemFree_v3020 MemFree = nullptr;
  PFN_cuMemcpyHtoD_v3020 MemcpyHtoD = nullptr;
  PFN_cuMemcpyDtoH_v3020 MemcpyDtoH = nullptr;
  PFN_cuMemsetD8_v3020 MemsetD8 = nullptr;
  PFN_cuStreamCreate_v2000 StreamCreate = nullptr;
  PFN_cuStreamDestroy_v4000 StreamDestroy = nullptr;
  PFN_cuStreamSynchronize_v2000 StreamSynchronize = nullptr;
  PFN_cuStreamIsCapturing_v10000 StreamIsCapturing = nullptr;
  // CUDA graphs: Run checks for capture; tests capture and replay it.
  PFN_cuStreamBeginCapture_v10010 StreamBeginCapture = nullptr;
  PFN_cuStreamEndCapture_v10000 StreamEndCapture = nullptr;
  PFN_cuGraphInstantiateWithFlags_v11040 GraphInstantiateWithFlags = nullptr;
  PFN_cuGraphLaunch_v10000 GraphLaunch = nullptr;
  PFN_cuGraphExecDestroy_v10000 GraphExecDestroy = nullptr;
  PFN_cuGraphDestroy_v10000 GraphDestroy = nullptr;
};

// The loaded driver. Immutable after loading; thread-safe.
class CudaDriver : public CudaDriverApi {
 public:
  // The process-wide driver: dlopen(kCudaDriverLibrary) and cuInit(0) on the
  // first call, the same answer (success or error) on every later one.
  // FailedPrecondition when there is no driver, the driver is older than
  // CUDA 12.0, or cuInit fails (e.g. CUDA_ERROR_NO_DEVICE).
  static absl::StatusOr<const CudaDriver*> Get();

  // Loads `library` as a driver, uncached (for tests: a missing library must
  // give the same clear error as a missing libcuda). The handle is never
  // closed: unloading a driver under live contexts is not safe.
  static absl::StatusOr<std::unique_ptr<const CudaDriver>> Load(const std::string& library);

  // OK for CUDA_SUCCESS; otherwise an error naming `call` and the driver's
  // name and description of `result` (see CudaErrorToStatus).
  absl::Status Check(CUresult result, std::string_view call) const;

  // Driver version as cuDriverGetVersion reports it (12040 = 12.4).
  int version() const { return version_; }

 private:
  CudaDriver() = default;
  int version_ = 0;
};

// Converts a failed driver call to a Status: "<call>: <name> (<description>)"
// with a code by cause: ResourceExhausted for out-of-memory,
// FailedPrecondition for a missing or unusable device or binary,
// InvalidArgument for invalid values and handles, Internal otherwise.
// `name`/`description` may be null (an unknown code). Pure, for tests.
absl::Status CudaErrorToStatus(CUresult result, std::string_view call, const char* name,
                               const char* description);

// Makes a context current on this thread for a scope and restores the
// previous one (no driver call beyond cuCtxGetCurrent when it already is).
class ScopedCudaContext {
 public:
  ScopedCudaContext(const CudaDriver& cu, CUcontext context);
  ~ScopedCudaContext();
  ScopedCudaContext(const ScopedCudaContext&) = delete;
  ScopedCudaContext& operator=(const ScopedCudaContext&) = delete;

  // The push's result; callers check it before using the context.
  const absl::Status& status() const { return status_; }

 private:
  const CudaDriver& cu_;
  bool pushed_ = false;
  absl::Status status_;
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_CUDA_DRIVER_H_
