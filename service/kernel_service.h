#ifndef KFORGE_SERVICE_KERNEL_SERVICE_H_
#define KFORGE_SERVICE_KERNEL_SERVICE_H_

#include <cstddef>
#include <memory>

#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "service/blocking_executor.h"
#include "service/get_kernel_wire.h"
#include "service/kernel_store.h"

namespace kforge {

// The largest request each method accepts. A GetKernel, GetManifest or
// Stats request is a selector and an arch, well under 1 KB; a Warm request
// lists up to max_prebuild_jobs kernels and archs. The server's transport
// limit is kMaxRequestBytes, so gRPC refuses anything larger before a
// handler sees it; the handlers check the smaller per-method limit. Answers
// (cubins, megabytes) have their own, larger limit.
inline constexpr size_t kMaxSmallRequestBytes = 64 << 10;
inline constexpr size_t kMaxWarmRequestBytes = 1 << 20;
inline constexpr size_t kMaxRequestBytes = kMaxWarmRequestBytes;

struct KernelServiceOptions {
  // Kernels one Prebuild call works on at once (each blocks a thread in
  // KernelStore::GetKernel; the store's compile pool bounds real work).
  int prebuild_parallelism = 4;
  // Most jobs (kernels x archs) one Prebuild/Warm call may ask for; a larger
  // request is refused before any work (ExpandPrebuildRequest). The default
  // matrix is 80 jobs.
  int max_prebuild_jobs = 4096;
  // Threads that run blocking store calls off gRPC's callback threads,
  // which must never block: a miss until its compile is under way (no
  // thread waits for a compile: 600 callers waiting on one held 512
  // threads, and a miss of another key queued behind them), the Warm
  // fan-out. Calls beyond this wait for a free thread.
  int max_blocking_threads = 512;
  // Threads that look a kernel up in the memory and disk tiers (no compile,
  // no wait for one) before a miss goes to the blocking threads, so that
  // nothing a compile does delays a hit: with 600 waiters on one compile a
  // disk hit took 36.5 s instead of 2 ms.
  int max_lookup_threads = 16;
};

// kforge.v1.KernelService over a KernelStore: each handler translates the
// request, delegates (to the store, or to PrebuildFanOut for Prebuild) and
// converts the status with ToGrpcStatus. Store calls that may block run on
// the service's BlockingExecutor, so gRPC's callback threads stay free; a
// GetKernel waiting for a compile holds no thread (KernelStore::GetKernelAsync). The store must
// outlive this object; destroy it only after the server has shut down (Server::Wait), when no call
// is left. Every method is registered raw (ByteBuffer): the handler checks the request's size
// against its method's limit and parses it itself, so that bytes that are not the request message
// are INVALID_ARGUMENT saying so (gRPC's generated handlers answer UNIMPLEMENTED or INTERNAL with
// an empty message), and a GetKernel memory hit is answered on the callback thread from the
// artifact's serialized bytes, shared without a copy (EncodeGetKernelResponse).
class KernelServiceImpl final : public v1::KernelService::WithRawCallbackMethod_GetKernel<
                                    v1::KernelService::WithRawCallbackMethod_GetManifest<
                                        v1::KernelService::WithRawCallbackMethod_Warm<
                                            v1::KernelService::WithRawCallbackMethod_Prebuild<
                                                v1::KernelService::WithRawCallbackMethod_Stats<
                                                    v1::KernelService::CallbackService>>>>> {
 public:
  explicit KernelServiceImpl(KernelStore* store, KernelServiceOptions options = {});
  ~KernelServiceImpl() override;  // joins the blocking threads

  grpc::ServerUnaryReactor* GetKernel(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Warm(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  // The deprecated name of Warm (one release): the same handler.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Prebuild(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override {
    return Warm(context, request);
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  KernelStore* store_;
  KernelServiceOptions options_;
  ArtifactWireCache wire_;
  // Destroyed (joined) before the members above, while what their tasks
  // use lives; lookups first, since a lookup may hand a miss to executor_.
  std::unique_ptr<BlockingExecutor> executor_;
  std::unique_ptr<BlockingExecutor> lookup_executor_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_KERNEL_SERVICE_H_
