#include "cli/health.h"

#include <cstdint>
#include <future>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"

namespace kforge::cli {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

// Reads a base-128 varint at *at; false when truncated or over 64 bits.
bool ReadVarint(absl::string_view bytes, size_t* at, uint64_t* out) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64 && *at < bytes.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(bytes[(*at)++]);
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = value;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string EncodeHealthCheckRequest(absl::string_view service) {
  if (service.empty()) return "";  // proto3: a default field is not written
  std::string out;
  out.push_back('\x0a');  // field 1, length-delimited
  for (uint64_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  out.append(service.data(), service.size());
  return out;
}

absl::StatusOr<int> DecodeHealthCheckResponse(absl::string_view bytes) {
  const auto bad = [](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("not a grpc.health.v1.HealthCheckResponse: ", why));
  };
  int status = static_cast<int>(ServingStatus::kUnknown);
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t tag = 0, value = 0;
    if (!ReadVarint(bytes, &at, &tag)) return bad("truncated tag");
    const uint64_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 0) return bad("field number 0");
    if (field == 1 && wire_type != 0) return bad("status is not a varint");
    switch (wire_type) {
      case 0:  // varint
        if (!ReadVarint(bytes, &at, &value)) return bad("truncated varint");
        if (field == 1) {
          if (value > 0x7fffffff) return bad("status out of range");
          status = static_cast<int>(value);
        }
        break;
      case 1:  // 64-bit
      case 5:  // 32-bit
      {
        const size_t size = wire_type == 1 ? 8 : 4;
        if (bytes.size() - at < size) return bad("truncated fixed-width field");
        at += size;
        break;
      }
      case 2:  // length-delimited
        if (!ReadVarint(bytes, &at, &value)) return bad("truncated length");
        if (value > bytes.size() - at) return bad("length past the end");
        at += static_cast<size_t>(value);
        break;
      default:
        return bad(absl::StrCat("wire type ", wire_type));
    }
  }
  return status;
}

std::string ServingStatusName(int status) {
  switch (static_cast<ServingStatus>(status)) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return absl::StrCat("status ", status);
}

grpc::Status CheckHealth(grpc::Channel& channel, absl::string_view service, absl::Duration timeout,
                         int* status) {
  grpc::GenericStub stub(channel.shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice slice(EncodeHealthCheckRequest(service));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, kCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status result = done.get_future().get();
  if (!result.ok()) return result;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the health answer");
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  absl::StatusOr<int> decoded = DecodeHealthCheckResponse(bytes);
  if (!decoded.ok()) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS, std::string(decoded.status().message()));
  }
  *status = *decoded;
  return grpc::Status::OK;
}

}  // namespace kforge::cli
