#include "service/status_mapping.h"

#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

// Bytes a message character costs in the grpc-message trailer, which
// percent-encodes everything outside printable ASCII and '%' itself.
size_t TrailerBytes(unsigned char c) { return (c < 0x20 || c > 0x7e || c == '%') ? 3 : 1; }

}  // namespace

std::string WireStatusMessage(absl::string_view message) {
  size_t wire = 0;
  size_t keep = 0;
  for (; keep < message.size(); ++keep) {
    wire += TrailerBytes(static_cast<unsigned char>(message[keep]));
    if (wire > kMaxStatusMessageBytes) break;
  }
  if (keep == message.size()) return std::string(message);
  // Leave room for the note; NVRTC puts the first (root-cause) error first,
  // so the head of a log is the part worth keeping.
  const std::string note =
      absl::StrCat("\n[kforge: message truncated, ", message.size(), " bytes in all]");
  while (keep > 0 && wire + note.size() > kMaxStatusMessageBytes) {
    --keep;
    wire -= TrailerBytes(static_cast<unsigned char>(message[keep]));
  }
  return absl::StrCat(message.substr(0, keep), note);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int raw = static_cast<int>(status.code());
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code.
  const grpc::StatusCode code =
      raw >= 1 && raw <= 16 ? static_cast<grpc::StatusCode>(raw) : grpc::StatusCode::UNKNOWN;
  return grpc::Status(code, WireStatusMessage(status.message()));
}

}  // namespace kforge
