#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"

namespace kforge {
namespace {

absl::Status NoDriver(const std::string& library, std::string_view detail) {
  return absl::FailedPreconditionError(
      absl::StrCat("no CUDA driver (", library,
                   " not found): kforge's runtime needs an NVIDIA driver; the compile "
                   "service does not [",
                   AsAbsl(detail), "]"));
}

std::string VersionString(int version) {
  return absl::StrCat(version / 1000, ".", version % 1000 / 10);
}

// Resolves every entry point of `api` through cuGetProcAddress at
// kCudaApiVersion.
absl::Status Resolve(PFN_cuGetProcAddress_v12000 get_proc, CudaDriverApi& api) {
  struct Entry {
    const char* name;
    void** slot;
  };
  // The cast keeps the table short; each slot's type is the PFN of the
  // 12.0 ABI version that cuGetProcAddress returns for kCudaApiVersion.
  auto slot = [](auto& fn) { return reinterpret_cast<void**>(&fn); };
  const Entry entries[] = {
      {"cuGetErrorName", slot(api.GetErrorName)},
      {"cuGetErrorString", slot(api.GetErrorString)},
      {"cuInit", slot(api.Init)},
      {"cuDriverGetVersion", slot(api.DriverGetVersion)},
      {"cuDeviceGet", slot(api.DeviceGet)},
      {"cuDeviceGetCount", slot(api.DeviceGetCount)},
      {"cuDeviceGetAttribute", slot(api.DeviceGetAttribute)},
      {"cuDeviceGetName", slot(api.DeviceGetName)},
      {"cuDevicePrimaryCtxRetain", slot(api.DevicePrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease", slot(api.DevicePrimaryCtxRelease)},
      {"cuCtxGetCurrent", slot(api.CtxGetCurrent)},
      {"cuCtxSetCurrent", slot(api.CtxSetCurrent)},
      {"cuCtxPushCurrent", slot(api.CtxPushCurrent)},
      {"cuCtxPopCurrent", slot(api.CtxPopCurrent)},
      {"cuCtxSynchronize", slot(api.CtxSynchronize)},
      {"cuLibraryLoadData", slot(api.LibraryLoadData)},
      {"cuLibraryUnload", slot(api.LibraryUnload)},
      {"cuLibraryGetKernel", slot(api.LibraryGetKernel)},
      {"cuKernelSetAttribute", slot(api.KernelSetAttribute)},
      {"cuKernelGetFunction", slot(api.KernelGetFunction)},
      {"cuOccupancyMaxActiveClusters", slot(api.OccupancyMaxActiveClusters)},
      {"cuLaunchKernel", slot(api.LaunchKernel)},
      {"cuLaunchKernelEx", slot(api.LaunchKernelEx)},
      {"cuMemAlloc", slot(api.MemAlloc)},
      {"cuMemFree", slot(api.MemFree)},
      {"cuMemcpyHtoD", slot(api.MemcpyHtoD)},
      {"cuMemcpyDtoH", slot(api.MemcpyDtoH)},
      {"cuMemsetD8", slot(api.MemsetD8)},
      {"cuStreamCreate", slot(api.StreamCreate)},
      {"cuStreamDestroy", slot(api.StreamDestroy)},
      {"cuStreamSynchronize", slot(api.StreamSynchronize)},
      {"cuStreamIsCapturing", slot(api.StreamIsCapturing)},
      {"cuStreamBeginCapture", slot(api.StreamBeginCapture)},
      {"cuStreamEndCapture", slot(api.StreamEndCapture)},
      {"cuGraphInstantiateWithFlags", slot(api.GraphInstantiateWithFlags)},
      {"cuGraphLaunch", slot(api.GraphLaunch)},
      {"cuGraphExecDestroy", slot(api.GraphExecDestroy)},
      {"cuGraphDestroy", slot(api.GraphDestroy)},
  };
  for (const Entry& e : entries) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult r =
        get_proc(e.name, e.slot, kCudaApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || *e.slot == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the NVIDIA driver does not provide ", e.name, " (CUDA ",
                       VersionString(kCudaApiVersion), " API): cuGetProcAddress returned ",
                       static_cast<int>(r), ", query result ", static_cast<int>(found)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaErrorToStatus(CUresult result, std::string_view call, const char* name,
                               const char* description) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(AsAbsl(call), ": ",
                   name != nullptr ? name : absl::StrCat("CUresult ", static_cast<int>(result)),
                   " (", description != nullptr ? description : "unknown error", ")");
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      return absl::ResourceExhaustedError(message);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    // CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: named in CUDA 13's cuda.h, not
    // in 12.x's (the wheel builds against 12.x headers); drivers return it.
    case static_cast<CUresult>(36):
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return absl::FailedPreconditionError(message);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_NOT_FOUND:
      return absl::InvalidArgumentError(message);
    case CUDA_ERROR_INVALID_IMAGE:
      // A cubin the driver cannot parse: the artifact is damaged.
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaDriver::Check(CUresult result, std::string_view call) const {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* description = nullptr;
  if (GetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (GetErrorString(result, &description) != CUDA_SUCCESS) description = nullptr;
  return CudaErrorToStatus(result, call, name, description);
}

absl::StatusOr<std::unique_ptr<const CudaDriver>> CudaDriver::Load(const std::string& library) {
  // RTLD_LOCAL: the driver's symbols are only reached through the table.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return NoDriver(library, error != nullptr ? error : "dlopen failed");
  }
  int version = 0;
  auto get_version =
      reinterpret_cast<PFN_cuDriverGetVersion_v2020>(dlsym(handle, "cuDriverGetVersion"));
  if (get_version == nullptr || get_version(&version) != CUDA_SUCCESS) {
    return NoDriver(library, "it does not export cuDriverGetVersion");
  }
  // cuGetProcAddress_v2 (with the query result) is the CUDA 12 entry point.
  auto get_proc =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(handle, "cuGetProcAddress_v2"));
  if (version < kCudaApiVersion || get_proc == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver (", library, ") supports CUDA ", VersionString(version),
                     "; kforge's runtime needs CUDA ", VersionString(kCudaApiVersion),
                     " or newer (cuLibraryLoadData): update the driver"));
  }
  std::unique_ptr<CudaDriver> driver(new CudaDriver());
  driver->version_ = version;
  if (absl::Status s = Resolve(get_proc, *driver); !s.ok()) return s;
  // CUDA_ERROR_STUB_LIBRARY here means the toolkit's stub was found instead
  // of a driver; CudaErrorToStatus makes it (and NO_DEVICE) a
  // FailedPrecondition.
  if (absl::Status s = driver->Check(driver->Init(0), "cuInit(0)"); !s.ok()) {
    return s;
  }
  return std::unique_ptr<const CudaDriver>(std::move(driver));
}

absl::StatusOr<const CudaDriver*> CudaDriver::Get() {
  // Loaded once; the driver stays loaded for the life of the process.
  static const auto* const kDriver =
      new absl::StatusOr<std::unique_ptr<const CudaDriver>>(Load(kCudaDriverLibrary));
  if (!kDriver->ok()) return kDriver->status();
  return kDriver->value().get();
}

ScopedCudaContext::ScopedCudaContext(const CudaDriver& cu, CUcontext context) : cu_(cu) {
  CUcontext current = nullptr;
  status_ = cu.Check(cu.CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (!status_.ok() || current == context) return;
  status_ = cu.Check(cu.CtxPushCurrent(context), "cuCtxPushCurrent");
  pushed_ = status_.ok();
}

ScopedCudaContext::~ScopedCudaContext() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  // Nothing useful to do on failure in a destructor; the push succeeded, so
  // the pop only fails if the caller popped our context itself.
  (void)cu_.CtxPopCurrent(&popped);
}

}  // namespace kforge
