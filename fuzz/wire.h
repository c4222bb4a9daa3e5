#ifndef KFORGE_FUZZ_WIRE_H_
#define KFORGE_FUZZ_WIRE_H_

// Message bytes decoded the way gRPC takes them off the wire
// (GenericDeserialize: what service/kernel_service.cc does with a request and
// a generated client stub with an answer), for the request and answer
// targets. Header-only, so fuzz_support links no gRPC.

#include <cstddef>
#include <cstdint>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace kforge::fuzz {

// False when gRPC refuses the bytes as a `Message`.
template <class Message>
bool DecodeFromWire(const uint8_t* data, size_t size, Message* out) {
  grpc::Slice slice(data, size);
  grpc::ByteBuffer buffer(&slice, 1);
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, Message>(&buffer, out).ok();
}

}  // namespace kforge::fuzz

#endif  // KFORGE_FUZZ_WIRE_H_
