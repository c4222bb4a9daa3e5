#include "service/get_kernel_wire.h"

#include <cstdint>

namespace kforge {
namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void ReleaseBytes(void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }

}  // namespace

// Field 1 (artifact, length-delimited), 2 (source, varint), 3 (seconds,
// fixed64 double).
grpc::ByteBuffer EncodeGetKernelResponse(std::shared_ptr<const std::string> artifact_bytes,
                                         v1::ArtifactSource source, double seconds) {
  std::string head(1, '\x0a');
  PutVarint(artifact_bytes->size(), &head);
  std::string tail(1, '\x10');
  PutVarint(static_cast<uint64_t>(source), &tail);
  tail.push_back('\x19');
  tail.append(reinterpret_cast<const char*>(&seconds), sizeof(seconds));
  char* data = const_cast<char*>(artifact_bytes->data());
  const size_t size = artifact_bytes->size();
  grpc::Slice slices[3] = {
      grpc::Slice(head),
      grpc::Slice(data, size, ReleaseBytes,
                  new std::shared_ptr<const std::string>(std::move(artifact_bytes))),
      grpc::Slice(tail)};
  return grpc::ByteBuffer(slices, 3);
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
