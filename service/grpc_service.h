#ifndef KFORGE_SERVICE_GRPC_SERVICE_H_
#define KFORGE_SERVICE_GRPC_SERVICE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "service/kernel_store.h"

namespace kforge {

// Status messages are cut (saying so) to this many bytes as they go on the
// wire. They travel in the grpc-message trailer, which percent-encodes
// newlines and non-ASCII bytes (3 bytes each), and C-core clients (C++,
// Python) drop a response whose metadata exceeds 8 KiB: with grpc 1.51 an
// 8 KiB message reaches the client as RESOURCE_EXHAUSTED "received initial
// metadata size exceeds limit", 7 KiB arrives intact (server_test). So an
// NVRTC log is cut here rather than turning a clear INTERNAL into an
// unreadable transport error. 6 KiB leaves room for the other headers.
inline constexpr size_t kMaxStatusMessageBytes = 6 * 1024;

// The one place where an absl::Status becomes a grpc::Status: keeps the
// canonical code (the two enums share their numbering) and truncates long
// messages.
grpc::Status ToGrpcStatus(const absl::Status& status);

struct KernelServiceOptions {
  // Kernels one Prebuild call works on at once (each blocks a thread in
  // KernelStore::GetKernel; the store's compile pool bounds real work).
  int prebuild_parallelism = 4;
  // Threads that run blocking store calls off gRPC's callback threads,
  // which must never block. Calls beyond this wait for a free thread.
  int max_blocking_threads = 512;
};

// kforge.v1.KernelService over a KernelStore: handlers translate requests,
// call the store and convert its status; the logic lives in the store.
// Blocking store calls (GetKernel can wait for a compile) run on the
// service's own threads, so gRPC's callback threads stay free. The store
// must outlive this object; destroy it only after the server has shut down
// (Server::Wait), when no call is left.
// GetKernel is registered as a raw (ByteBuffer) method so that a memory hit
// is answered on the callback thread from the artifact's serialized bytes,
// shared without a copy; everything else goes through the store.
class KernelServiceImpl final
    : public v1::KernelService::WithRawCallbackMethod_GetKernel<
          v1::KernelService::CallbackService> {
 public:
  explicit KernelServiceImpl(KernelStore* store,
                             KernelServiceOptions options = {});
  ~KernelServiceImpl() override;  // joins the blocking threads

  grpc::ServerUnaryReactor* GetKernel(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::Manifest* response) override;
  grpc::ServerWriteReactor<v1::PrebuildProgress>* Prebuild(
      grpc::CallbackServerContext* context,
      const v1::PrebuildRequest* request) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;

  class BlockingExecutor;

 private:
  // The wire bytes of a cached artifact, serialized once per artifact.
  std::shared_ptr<const std::string> WireBytes(const ArtifactPtr& artifact);

  KernelStore* store_;
  KernelServiceOptions options_;
  std::unique_ptr<BlockingExecutor> executor_;
  // artifact -> (the artifact, kept alive; its serialized bytes). Bounded:
  // cleared when it reaches kMaxWire entries; in-flight responses keep
  // their bytes alive through the slice's own reference.
  static constexpr size_t kMaxWire = 256;
  std::mutex wire_mu_;
  std::map<const v1::KernelArtifact*,
           std::pair<ArtifactPtr, std::shared_ptr<const std::string>>>
      wire_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_GRPC_SERVICE_H_
