#ifndef KFORGE_SERVICE_PREBUILD_REACTOR_H_
#define KFORGE_SERVICE_PREBUILD_REACTOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "kforge/v1/service.pb.h"
#include "service/blocking_executor.h"
#include "service/prebuild_fanout.h"

namespace kforge {

// The Prebuild stream over a PrebuildFanOut: writes its messages one at a
// time as they come and finishes once it has finished (CANCELLED when the
// client went away). `jobs` not ok: the call fails with that status and
// nothing is built. The reactor deletes itself when the call is done.
// Messages are written serialized (the service's methods are raw).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPrebuildReactor(
    absl::StatusOr<std::vector<PrebuildJob>> jobs, PrebuildFanOut::Options options,
    PrebuildFanOut::KernelGetter get, BlockingExecutor& executor);

}  // namespace kforge

#endif  // KFORGE_SERVICE_PREBUILD_REACTOR_H_
