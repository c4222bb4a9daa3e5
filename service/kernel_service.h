#ifndef KFORGE_SERVICE_KERNEL_SERVICE_H_
#define KFORGE_SERVICE_KERNEL_SERVICE_H_

#include <memory>

#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "service/blocking_executor.h"
#include "service/get_kernel_wire.h"
#include "service/kernel_store.h"

namespace kforge {

struct KernelServiceOptions {
  // Kernels one Prebuild call works on at once (each blocks a thread in
  // KernelStore::GetKernel; the store's compile pool bounds real work).
  int prebuild_parallelism = 4;
  // Threads that run blocking store calls off gRPC's callback threads,
  // which must never block. Calls beyond this wait for a free thread.
  int max_blocking_threads = 512;
};

// kforge.v1.KernelService over a KernelStore: each handler translates the
// request, delegates (to the store, or to PrebuildFanOut for Prebuild) and
// converts the status with ToGrpcStatus. Blocking store calls (GetKernel can
// wait for a compile) run on the service's BlockingExecutor, so gRPC's
// callback threads stay free. The store must outlive this object; destroy
// it only after the server has shut down (Server::Wait), when no call is
// left.
// GetKernel is registered as a raw (ByteBuffer) method so that a memory hit
// is answered on the callback thread from the artifact's serialized bytes,
// shared without a copy (EncodeGetKernelResponse).
class KernelServiceImpl final : public v1::KernelService::WithRawCallbackMethod_GetKernel<
                                    v1::KernelService::CallbackService> {
 public:
  explicit KernelServiceImpl(KernelStore* store, KernelServiceOptions options = {});
  ~KernelServiceImpl() override;  // joins the blocking threads

  grpc::ServerUnaryReactor* GetKernel(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::Manifest* response) override;
  grpc::ServerWriteReactor<v1::PrebuildProgress>* Warm(grpc::CallbackServerContext* context,
                                                       const v1::PrebuildRequest* request) override;
  // The deprecated name of Warm (one release): the same handler.
  grpc::ServerWriteReactor<v1::PrebuildProgress>* Prebuild(
      grpc::CallbackServerContext* context, const v1::PrebuildRequest* request) override {
    return Warm(context, request);
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;

 private:
  KernelStore* store_;
  KernelServiceOptions options_;
  ArtifactWireCache wire_;
  // Last member: destroyed (joined) first, while what its tasks use lives.
  std::unique_ptr<BlockingExecutor> executor_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_KERNEL_SERVICE_H_
