#ifndef KFORGE_SERVICE_STATUS_MAPPING_H_
#define KFORGE_SERVICE_STATUS_MAPPING_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

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

// `message` as it goes on the wire: whole when its trailer encoding fits
// kMaxStatusMessageBytes, else its head and a note saying how long it was.
std::string WireStatusMessage(absl::string_view message);

// The one place where an absl::Status becomes a grpc::Status: keeps the
// canonical code (the two enums share their numbering) and the message as
// WireStatusMessage cuts it.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kforge

#endif  // KFORGE_SERVICE_STATUS_MAPPING_H_
