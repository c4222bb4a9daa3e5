#ifndef KFORGE_SERVICE_GET_KERNEL_WIRE_H_
#define KFORGE_SERVICE_GET_KERNEL_WIRE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "kforge/v1/service.pb.h"
#include "service/artifact_cache.h"

namespace kforge {

// A GetKernelResponse as gRPC sends it, built around the artifact's
// already-serialized bytes, which are shared, not copied (a hit would
// otherwise copy the cubin twice: into the response message and into its
// serialization). Field numbers come from the generated code, and
// get_kernel_wire_test pins the bytes to GetKernelResponse::
// SerializeAsString for several artifacts, so a change to service.proto
// that this encoding does not follow fails a test instead of the wire.
grpc::ByteBuffer EncodeGetKernelResponse(std::shared_ptr<const std::string> artifact_bytes,
                                         v1::ArtifactSource source, double seconds);

// The serialized bytes of cached artifacts, made once per artifact.
// Bounded: cleared when it reaches kMaxEntries; in-flight responses keep
// their bytes alive through the slice's own reference. Thread-safe.
class ArtifactWireCache {
 public:
  std::shared_ptr<const std::string> Bytes(const ArtifactPtr& artifact) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr size_t kMaxEntries = 256;
  absl::Mutex mu_;
  // artifact -> (the artifact, kept alive so its address is not reused;
  // its serialized bytes).
  std::map<const v1::KernelArtifact*, std::pair<ArtifactPtr, std::shared_ptr<const std::string>>>
      bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_GET_KERNEL_WIRE_H_
