#ifndef KFORGE_CLI_HEALTH_H_
#define KFORGE_CLI_HEALTH_H_

// The client side of grpc.health.v1.Health/Check, for `kforge health` (the
// container image's HEALTHCHECK). The messages are spoken in raw bytes, as
// the tests do: the installed gRPC ships no generated code for the health
// proto, and the two messages are one field each.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace kforge::cli {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// HealthCheckRequest{service}: "" asks about the whole server.
std::string EncodeHealthCheckRequest(absl::string_view service);

// The status field of a HealthCheckResponse (UNKNOWN when absent, as in
// proto3; fields it does not know are skipped); DataLoss when the bytes are
// not such a message.
absl::StatusOr<int> DecodeHealthCheckResponse(absl::string_view bytes);

// "SERVING", "NOT_SERVING", ..., or "status N" for a value this does not
// name.
std::string ServingStatusName(int status);

// Calls Health/Check for `service` within `timeout`; on OK, *status is the
// answered ServingStatus value.
grpc::Status CheckHealth(grpc::Channel& channel, absl::string_view service, absl::Duration timeout,
                         int* status);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_HEALTH_H_
