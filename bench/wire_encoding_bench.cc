// What the hand-made GetKernelResponse encoding (service/get_kernel_wire.h)
// saves over the generated code on a memory hit: encodes one response per
// iteration both ways for an artifact of a given cubin size and prints the
// time per response.
//
//   build/bench/kforge_wire_encoding_bench [CUBIN_BYTES] [ITERATIONS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "kforge/v1/service.pb.h"
#include "service/get_kernel_wire.h"

namespace {

template <typename F>
double NanosPerCall(int iterations, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  size_t sink = 0;
  for (int i = 0; i < iterations; ++i) sink += f().Length();
  const auto end = std::chrono::steady_clock::now();
  if (sink == 0) std::puts("");
  return std::chrono::duration<double, std::nano>(end - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t cubin_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 44464;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 20000;
  auto artifact = std::make_shared<kforge::v1::KernelArtifact>();
  artifact->set_key(std::string(64, 'a'));
  artifact->set_module_name("sparse_mla_decode_h8_d512r64_topk2048_sq1_bf16_pb64_sm90a");
  artifact->set_arch("sm_90a");
  artifact->set_cubin(std::string(cubin_bytes, '\x5a'));
  const kforge::ArtifactPtr cached = artifact;
  kforge::ArtifactWireCache wire;

  const double zero_copy = NanosPerCall(iterations, [&] {
    return kforge::EncodeGetKernelResponse(wire.Bytes(cached), kforge::v1::ARTIFACT_SOURCE_MEMORY,
                                           4e-6);
  });
  const double generated = NanosPerCall(iterations, [&] {
    kforge::v1::GetKernelResponse response;
    *response.mutable_artifact() = *cached;
    response.set_source(kforge::v1::ARTIFACT_SOURCE_MEMORY);
    response.set_seconds(4e-6);
    grpc::ByteBuffer buffer;
    bool own = false;
    (void)grpc::GenericSerialize<grpc::ProtoBufferWriter, kforge::v1::GetKernelResponse>(
        response, &buffer, &own);
    return buffer;
  });
  std::printf(
      "cubin %zu bytes, %d iterations: zero-copy %.0f ns/response, "
      "generated %.0f ns/response\n",
      cubin_bytes, iterations, zero_copy, generated);
  return 0;
}
