#include "service/get_kernel_wire.h"

#include <cstdint>
#include <cstring>

#include "google/protobuf/wire_format_lite.h"

namespace kforge {
namespace {

using google::protobuf::internal::WireFormatLite;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(int field, WireFormatLite::WireType type, std::string* out) {
  PutVarint(WireFormatLite::MakeTag(field, type), out);
}

void ReleaseBytes(void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }

}  // namespace

grpc::ByteBuffer EncodeGetKernelResponse(std::shared_ptr<const std::string> artifact_bytes,
                                         v1::ArtifactSource source, double seconds) {
  using Response = v1::GetKernelResponse;
  // Fields in number order, proto3 defaults left out, as the generated
  // serializer writes them.
  static_assert(Response::kArtifactFieldNumber < Response::kSourceFieldNumber &&
                Response::kSourceFieldNumber < Response::kSecondsFieldNumber);
  std::string head;
  PutTag(Response::kArtifactFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &head);
  PutVarint(artifact_bytes->size(), &head);
  std::string tail;
  if (source != 0) {
    PutTag(Response::kSourceFieldNumber, WireFormatLite::WIRETYPE_VARINT, &tail);
    // An enum is written as a sign-extended int32 varint.
    PutVarint(static_cast<uint64_t>(static_cast<int64_t>(source)), &tail);
  }
  uint64_t seconds_bits;
  std::memcpy(&seconds_bits, &seconds, sizeof(seconds));
  if (seconds_bits != 0) {  // +0.0 is the default; -0.0 is written
    PutTag(Response::kSecondsFieldNumber, WireFormatLite::WIRETYPE_FIXED64, &tail);
    for (int i = 0; i < 8; ++i) tail.push_back(static_cast<char>(seconds_bits >> (8 * i)));
  }
  char* data = const_cast<char*>(artifact_bytes->data());
  const size_t size = artifact_bytes->size();
  grpc::Slice slices[3] = {
      grpc::Slice(head),
      grpc::Slice(data, size, ReleaseBytes,
                  new std::shared_ptr<const std::string>(std::move(artifact_bytes))),
      grpc::Slice(tail)};
  return grpc::ByteBuffer(slices, tail.empty() ? 2 : 3);
}

std::shared_ptr<const std::string> ArtifactWireCache::Bytes(const ArtifactPtr& artifact) {
  {
    absl::MutexLock lock(&mu_);
    auto it = bytes_.find(artifact.get());
    if (it != bytes_.end()) return it->second.second;
  }
  auto bytes = std::make_shared<const std::string>(artifact->SerializeAsString());
  absl::MutexLock lock(&mu_);
  if (bytes_.size() >= kMaxEntries) bytes_.clear();
  bytes_.emplace(artifact.get(), std::make_pair(artifact, bytes));
  return bytes;
}

}  // namespace kforge
