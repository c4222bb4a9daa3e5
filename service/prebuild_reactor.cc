#include "service/prebuild_reactor.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "service/status_mapping.h"

namespace kforge {
namespace {

// gRPC allows one write in flight, so the fan-out's messages wait in it
// until the previous write is done. The fan-out's workers and gRPC share
// `Shared` (not the reactor, which deletes itself in OnDone), and nothing
// calls into gRPC while holding its mutex, since a reaction may run inline
// on the calling thread.
class PrebuildReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PrebuildReactor() : shared_(std::make_shared<Shared>()) { shared_->reactor = this; }

  void Start(std::vector<PrebuildJob> jobs, PrebuildFanOut::Options options,
             PrebuildFanOut::KernelGetter get, BlockingExecutor& executor) {
    std::weak_ptr<Shared> weak = shared_;
    shared_->fanout = PrebuildFanOut::Create(std::move(jobs), options, std::move(get), [weak] {
      if (auto shared = weak.lock()) Pump(shared);
    });
    shared_->fanout->Start(executor);
    Pump(shared_);
  }

  void OnWriteDone(bool ok) override {
    // Pump may finish the call, and OnDone may then run inline and delete
    // this reactor: keep the state alive by a local reference.
    std::shared_ptr<Shared> shared = shared_;
    if (!ok) shared->fanout->Cancel();  // the client has gone
    {
      absl::MutexLock lock(&shared->mu);
      shared->writing = false;
    }
    Pump(shared);
  }

  void OnCancel() override {
    if (shared_->fanout != nullptr) shared_->fanout->Cancel();
  }

  void OnDone() override { delete this; }

 private:
  struct Shared {
    // Set before the fan-out starts, never changed.
    std::shared_ptr<PrebuildFanOut> fanout;
    absl::Mutex mu;
    PrebuildReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // valid until finished
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    grpc::ByteBuffer in_write ABSL_GUARDED_BY(mu);  // the message being written, serialized
  };

  // Starts the next write or finishes the call, whichever is due.
  static void Pump(const std::shared_ptr<Shared>& shared) {
    absl::MutexLock lock(&shared->mu);
    if (shared->finished || shared->writing) return;
    PrebuildFanOut::Event event = shared->fanout->Next();
    PrebuildReactor* reactor = shared->reactor;
    if (event.progress.has_value()) {
      shared->writing = true;
      v1::PrebuildProgress& progress = *event.progress;
      if (!progress.error().empty()) progress.set_error(WireStatusMessage(progress.error()));
      bool own_buffer = false;
      shared->in_write.Clear();
      // Serializing a valid message into a fresh buffer cannot fail.
      (void)grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::PrebuildProgress>(
          progress, &shared->in_write, &own_buffer);
      const grpc::ByteBuffer* message = &shared->in_write;
      shared->mu.Unlock();
      reactor->StartWrite(message);
      shared->mu.Lock();
      return;
    }
    if (!event.finished) return;
    // Every worker has returned and no write is in flight: nothing touches
    // the reactor after this.
    shared->finished = true;
    shared->reactor = nullptr;
    shared->mu.Unlock();
    reactor->Finish(event.cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
    shared->mu.Lock();
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPrebuildReactor(
    absl::StatusOr<std::vector<PrebuildJob>> jobs, PrebuildFanOut::Options options,
    PrebuildFanOut::KernelGetter get, BlockingExecutor& executor) {
  auto* reactor = new PrebuildReactor();
  if (!jobs.ok()) {
    reactor->Finish(ToGrpcStatus(jobs.status()));
    return reactor;
  }
  reactor->Start(*std::move(jobs), options, std::move(get), executor);
  return reactor;
}

}  // namespace kforge
