#include "service/kernel_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/proto_buffer_reader.h"
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

}  // namespace

KernelServiceImpl::KernelServiceImpl(KernelStore* store, KernelServiceOptions options)
    : store_(store),
      options_(options),
      executor_(std::make_unique<BlockingExecutor>(options.max_blocking_threads)) {}

KernelServiceImpl::~KernelServiceImpl() = default;

grpc::ServerUnaryReactor* KernelServiceImpl::GetKernel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  auto request = std::make_shared<v1::GetKernelRequest>();
  {
    grpc::ByteBuffer copy(*request_bytes);  // shares slices, no byte copy
    grpc::Status parsed = grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::GetKernelRequest>(
        &copy, request.get());
    if (!parsed.ok()) {
      reactor->Finish(parsed);
      return reactor;
    }
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
  // The response buffer and reactor stay valid until Finish.
  executor_->Run([this, reactor, request, response, deadline, start] {
    absl::StatusOr<v1::AttentionSpec> spec = KernelStore::Resolve(request->kernel());
    absl::StatusOr<KernelStore::Result> result =
        spec.ok() ? store_->GetKernel(*spec, request->arch(), request->lookup_only(), deadline)
                  : absl::StatusOr<KernelStore::Result>(spec.status());
    if (result.ok()) {
      *response = EncodeGetKernelResponse(wire_.Bytes(result->artifact), result->source,
                                          absl::ToDoubleSeconds(absl::Now() - start));
    }
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::GetManifest(grpc::CallbackServerContext* context,
                                                         const v1::GetManifestRequest* request,
                                                         v1::Manifest* response) {
  // Planning only, no compile: cheap enough for the callback thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::AttentionSpec> spec = KernelStore::Resolve(request->kernel());
  absl::StatusOr<v1::Manifest> manifest = spec.ok() ? store_->GetManifest(*spec, request->arch())
                                                    : absl::StatusOr<v1::Manifest>(spec.status());
  if (manifest.ok()) *response = *std::move(manifest);
  reactor->Finish(ToGrpcStatus(manifest.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Stats(grpc::CallbackServerContext* context,
                                                   const v1::StatsRequest* /*request*/,
                                                   v1::StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  *response = store_->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::PrebuildProgress>* KernelServiceImpl::Warm(
    grpc::CallbackServerContext* context, const v1::PrebuildRequest* request) {
  PrebuildFanOut::Options options;
  options.parallelism = options_.prebuild_parallelism;
  options.deadline = ToAbslDeadline(context->deadline());
  return StartPrebuildReactor(ExpandPrebuildRequest(*request), options,
                              PrebuildFanOut::StoreGetter(store_), *executor_);
}

}  // namespace kforge
