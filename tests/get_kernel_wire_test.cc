// The hand-made GetKernelResponse encoding (service/get_kernel_wire.h) is
// pinned byte for byte to the generated serializer, so that a change to
// service.proto it does not follow fails here and not on the wire.
#include "service/get_kernel_wire.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::string Generated(const v1::KernelArtifact& artifact, v1::ArtifactSource source,
                      double seconds) {
  v1::GetKernelResponse response;
  *response.mutable_artifact() = artifact;
  response.set_source(source);
  response.set_seconds(seconds);
  return response.SerializeAsString();
}

std::vector<v1::KernelArtifact> Artifacts() {
  std::vector<v1::KernelArtifact> out;
  out.emplace_back();  // every field empty: a zero-length submessage
  v1::KernelArtifact small;
  small.set_key(std::string(64, 'a'));
  small.set_module_name("sparse_mla_decode_h8");
  out.push_back(small);
  v1::KernelArtifact big = small;
  big.set_cubin(std::string(300 * 1024, '\x7f'));  // a 3-byte length varint
  big.set_arch("sm_90a");
  big.set_compile_seconds(1.5);
  big.mutable_spec()->mutable_sparse_mla_decode()->set_topk(2048);
  big.mutable_spec()->mutable_sparse_mla_decode()->set_num_q_heads(8);
  out.push_back(big);
  v1::KernelArtifact long_one = small;
  long_one.set_cubin(std::string(200, '\0'));  // a 2-byte length varint
  out.push_back(long_one);
  return out;
}

TEST(GetKernelWireTest, MatchesTheGeneratedSerialization) {
  const std::vector<v1::ArtifactSource> sources = {
      v1::ARTIFACT_SOURCE_UNSPECIFIED, v1::ARTIFACT_SOURCE_MEMORY, v1::ARTIFACT_SOURCE_DISK,
      v1::ARTIFACT_SOURCE_COMPILED, v1::ARTIFACT_SOURCE_SHARED_COMPILE};
  const std::vector<double> seconds = {0.0, -0.0, 1e-6, 12.5,
                                       std::numeric_limits<double>::infinity()};
  for (const v1::KernelArtifact& artifact : Artifacts()) {
    auto bytes = std::make_shared<const std::string>(artifact.SerializeAsString());
    for (v1::ArtifactSource source : sources) {
      for (double s : seconds) {
        EXPECT_EQ(Flatten(EncodeGetKernelResponse(bytes, source, s)),
                  Generated(artifact, source, s))
            << "artifact of " << bytes->size() << " bytes, source " << source << ", seconds " << s;
      }
    }
  }
}

TEST(GetKernelWireTest, ParsesBackToTheSameResponse) {
  const v1::KernelArtifact artifact = Artifacts()[2];
  auto bytes = std::make_shared<const std::string>(artifact.SerializeAsString());
  v1::GetKernelResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(
      Flatten(EncodeGetKernelResponse(bytes, v1::ARTIFACT_SOURCE_DISK, 0.25))));
  EXPECT_EQ(parsed.artifact().cubin(), artifact.cubin());
  EXPECT_EQ(parsed.source(), v1::ARTIFACT_SOURCE_DISK);
  EXPECT_EQ(parsed.seconds(), 0.25);
}

TEST(GetKernelWireTest, SharesTheArtifactBytesWithoutACopy) {
  auto bytes = std::make_shared<const std::string>(std::string(4096, 'x'));
  const char* data = bytes->data();
  grpc::ByteBuffer buffer = EncodeGetKernelResponse(bytes, v1::ARTIFACT_SOURCE_MEMORY, 1.0);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  bool shared = false;
  for (const grpc::Slice& s : slices) {
    shared |= reinterpret_cast<const char*>(s.begin()) == data;
  }
  EXPECT_TRUE(shared);
  // The buffer keeps the bytes alive after the caller lets go.
  EXPECT_GE(bytes.use_count(), 2);
}

TEST(ArtifactWireCacheTest, SerializesAnArtifactOnce) {
  ArtifactWireCache cache;
  auto artifact = std::make_shared<const v1::KernelArtifact>(Artifacts()[1]);
  std::shared_ptr<const std::string> first = cache.Bytes(artifact);
  EXPECT_EQ(*first, artifact->SerializeAsString());
  EXPECT_EQ(cache.Bytes(artifact).get(), first.get());
}

}  // namespace
}  // namespace kforge
