#include "service/kernel_service.h"

#include <chrono>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "service/prebuild_fanout.h"
#include "service/prebuild_reactor.h"
#include "service/status_mapping.h"

namespace kforge {
namespace {

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point deadline) {
  // gRPC reports "no deadline" as time_point::max().
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// A raw request checked and parsed: RESOURCE_EXHAUSTED (as gRPC answers a
// message over its transport limit) beyond `limit` bytes, INVALID_ARGUMENT
// when the bytes are not a `Request`; both name the method.
template <typename Request>
grpc::Status ParseRequest(absl::string_view method, const grpc::ByteBuffer& bytes, size_t limit,
                          Request* request) {
  if (bytes.Length() > limit) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(method, " request of ", bytes.Length(),
                                     " bytes is larger than the limit of ", limit, " bytes"));
  }
  grpc::ByteBuffer copy(bytes);  // shares slices, no byte copy
  grpc::Status parsed = grpc::GenericDeserialize<grpc::ProtoBufferReader, Request>(&copy, request);
  if (!parsed.ok()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat(method, " request of ", bytes.Length(), " bytes cannot be parsed as ",
                     Request::descriptor()->full_name()));
  }
  return grpc::Status::OK;
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& message) {
  grpc::ByteBuffer out;
  bool own_buffer = false;
  // Serializing a valid message into a fresh buffer cannot fail.
  (void)grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(message, &out,
                                                                                   &own_buffer);
  return out;
}

}  // namespace

KernelServiceImpl::KernelServiceImpl(KernelStore* store, KernelServiceOptions options)
    : store_(store),
      options_(options),
      executor_(std::make_unique<BlockingExecutor>(options.max_blocking_threads)),
      lookup_executor_(std::make_unique<BlockingExecutor>(options.max_lookup_threads)) {}

KernelServiceImpl::~KernelServiceImpl() = default;

grpc::ServerUnaryReactor* KernelServiceImpl::GetKernel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  auto request = std::make_shared<v1::GetKernelRequest>();
  if (grpc::Status parsed =
          ParseRequest("GetKernel", *request_bytes, kMaxSmallRequestBytes, request.get());
      !parsed.ok()) {
    reactor->Finish(parsed);
    return reactor;
  }
  // Memory hits never block: answer on the callback thread (measured in
  // BENCH.md: the executor hand-off and the artifact copy dominated a hit).
  if (absl::StatusOr<ArtifactPtr> hit = store_->MemoryHit(request->kernel(), request->arch());
      hit.ok()) {
    *response = EncodeGetKernelResponse(wire_.Bytes(*hit), v1::ARTIFACT_SOURCE_MEMORY,
                                        absl::ToDoubleSeconds(absl::Now() - start));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  const absl::Time deadline = ToAbslDeadline(context->deadline());
  // The response buffer and reactor stay valid until Finish. Two steps on
  // two executors: the memory and disk tiers on lookup threads, which no
  // compile ever holds, and only a miss on a blocking thread, which it
  // leaves once its compile is under way (GetKernelAsync).
  lookup_executor_->Run([this, reactor, request, response, deadline, start] {
    auto finish = [this, reactor, response,
                   start](const absl::StatusOr<KernelStore::Result>& result) {
      if (result.ok()) {
        *response = EncodeGetKernelResponse(wire_.Bytes(result->artifact), result->source,
                                            absl::ToDoubleSeconds(absl::Now() - start));
      }
      reactor->Finish(ToGrpcStatus(result.status()));
    };
    absl::StatusOr<v1::KernelSpec> spec = KernelStore::Resolve(request->kernel());
    if (!spec.ok()) return finish(spec.status());
    absl::StatusOr<KernelStore::Result> cached = store_->CachedKernel(*spec, request->arch());
    if (!absl::IsNotFound(cached.status())) return finish(cached);
    // A caller joining a compile in progress leaves the thread at once and
    // is answered by the compile's completion; only the caller that starts
    // a compile may hold it (while another process holds the key's lock).
    executor_->Run([this, request, spec = *std::move(spec), deadline, finish] {
      store_->GetKernelAsync(
          spec, request->arch(),
          KernelStore::Ask{request->lookup_only(), request->first_answer(), deadline}, finish);
    });
  });
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::GetManifest(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request_bytes,
                                                         grpc::ByteBuffer* response) {
  // Planning only, no compile: cheap enough for the callback thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::GetManifestRequest request;
  if (grpc::Status parsed =
          ParseRequest("GetManifest", *request_bytes, kMaxSmallRequestBytes, &request);
      !parsed.ok()) {
    reactor->Finish(parsed);
    return reactor;
  }
  absl::StatusOr<v1::KernelSpec> spec = KernelStore::Resolve(request.kernel());
  absl::StatusOr<v1::Manifest> manifest = spec.ok() ? store_->GetManifest(*spec, request.arch())
                                                    : absl::StatusOr<v1::Manifest>(spec.status());
  if (manifest.ok()) *response = Serialize(*manifest);
  reactor->Finish(ToGrpcStatus(manifest.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Stats(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request_bytes,
                                                   grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::StatsRequest request;
  if (grpc::Status parsed = ParseRequest("Stats", *request_bytes, kMaxSmallRequestBytes, &request);
      !parsed.ok()) {
    reactor->Finish(parsed);
    return reactor;
  }
  *response = Serialize(store_->Stats());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KernelServiceImpl::Warm(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  v1::PrebuildRequest request;
  if (grpc::Status parsed = ParseRequest("Warm", *request_bytes, kMaxWarmRequestBytes, &request);
      !parsed.ok()) {
    return StartPrebuildReactor(
        absl::Status(static_cast<absl::StatusCode>(parsed.error_code()), parsed.error_message()),
        {}, nullptr, *executor_);
  }
  PrebuildFanOut::Options options;
  options.parallelism = options_.prebuild_parallelism;
  options.deadline = ToAbslDeadline(context->deadline());
  return StartPrebuildReactor(ExpandPrebuildRequest(request, options_.max_prebuild_jobs), options,
                              PrebuildFanOut::StoreGetter(store_), *executor_);
}

}  // namespace kforge
