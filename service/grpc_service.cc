#include "service/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kforge {
namespace {

// Bytes a message character costs in the grpc-message trailer, which
// percent-encodes everything outside printable ASCII and '%' itself.
size_t WireBytes(unsigned char c) {
  return (c < 0x20 || c > 0x7e || c == '%') ? 3 : 1;
}

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point deadline) {
  // gRPC reports "no deadline" as time_point::max().
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

v1::PrebuildState StateFor(v1::ArtifactSource source) {
  switch (source) {
    case v1::ARTIFACT_SOURCE_MEMORY:
    case v1::ARTIFACT_SOURCE_DISK:
      return v1::PREBUILD_STATE_CACHED;
    default:
      return v1::PREBUILD_STATE_COMPILED;
  }
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int raw = static_cast<int>(status.code());
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code.
  const grpc::StatusCode code =
      raw >= 1 && raw <= 16 ? static_cast<grpc::StatusCode>(raw)
                            : grpc::StatusCode::UNKNOWN;
  const absl::string_view message = status.message();
  size_t wire = 0;
  size_t keep = 0;
  for (; keep < message.size(); ++keep) {
    wire += WireBytes(static_cast<unsigned char>(message[keep]));
    if (wire > kMaxStatusMessageBytes) break;
  }
  if (keep == message.size()) return grpc::Status(code, std::string(message));
  // Leave room for the note; NVRTC puts the first (root-cause) error first,
  // so the head of a log is the part worth keeping.
  const std::string note = absl::StrCat(
      "\n[kforge: message truncated, ", message.size(), " bytes in all]");
  while (keep > 0 && wire + note.size() > kMaxStatusMessageBytes) {
    --keep;
    wire -= WireBytes(static_cast<unsigned char>(message[keep]));
  }
  return grpc::Status(code, absl::StrCat(message.substr(0, keep), note));
}

// Runs blocking tasks on threads created on demand and kept for reuse, so a
// cache hit does not pay for a thread and calls waiting on a long compile
// do not hold up the others (up to max_threads, then tasks queue).
class KernelServiceImpl::BlockingExecutor {
 public:
  explicit BlockingExecutor(int max_threads)
      : max_threads_(max_threads < 1 ? 1 : max_threads) {}

  ~BlockingExecutor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void Run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (idle_ < static_cast<int>(tasks_.size()) &&
        static_cast<int>(threads_.size()) < max_threads_) {
      threads_.emplace_back([this] { Loop(); });
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // stopping
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  const int max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

KernelServiceImpl::KernelServiceImpl(KernelStore* store,
                                     KernelServiceOptions options)
    : store_(store),
      options_(options),
      executor_(std::make_unique<BlockingExecutor>(options.max_blocking_threads)) {}

KernelServiceImpl::~KernelServiceImpl() = default;

namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void ReleaseWire(void* p) {
  delete static_cast<std::shared_ptr<const std::string>*>(p);
}

// GetKernelResponse on the wire, built around already-serialized artifact
// bytes: field 1 (artifact, length-delimited), 2 (source, varint),
// 3 (seconds, fixed64 double). The artifact bytes are not copied.
grpc::ByteBuffer EncodeResponse(std::shared_ptr<const std::string> artifact,
                                v1::ArtifactSource source, double seconds) {
  std::string head(1, '\x0a');
  PutVarint(artifact->size(), &head);
  std::string tail(1, '\x10');
  PutVarint(static_cast<uint64_t>(source), &tail);
  tail.push_back('\x19');
  tail.append(reinterpret_cast<const char*>(&seconds), sizeof(seconds));
  char* data = const_cast<char*>(artifact->data());
  const size_t size = artifact->size();
  grpc::Slice slices[3] = {
      grpc::Slice(head),
      grpc::Slice(data, size, ReleaseWire,
                  new std::shared_ptr<const std::string>(std::move(artifact))),
      grpc::Slice(tail)};
  return grpc::ByteBuffer(slices, 3);
}

}  // namespace

std::shared_ptr<const std::string> KernelServiceImpl::WireBytes(
    const ArtifactPtr& artifact) {
  {
    std::lock_guard<std::mutex> lock(wire_mu_);
    auto it = wire_.find(artifact.get());
    if (it != wire_.end()) return it->second.second;
  }
  auto bytes = std::make_shared<const std::string>(artifact->SerializeAsString());
  std::lock_guard<std::mutex> lock(wire_mu_);
  if (wire_.size() >= kMaxWire) wire_.clear();
  wire_.emplace(artifact.get(), std::make_pair(artifact, bytes));
  return bytes;
}

grpc::ServerUnaryReactor* KernelServiceImpl::GetKernel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  auto request = std::make_shared<v1::GetKernelRequest>();
  {
    grpc::ByteBuffer copy(*request_bytes);  // shares slices, no byte copy
    grpc::Status parsed =
        grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::GetKernelRequest>(
            &copy, request.get());
    if (!parsed.ok()) {
      reactor->Finish(parsed);
      return reactor;
    }
  }
  // Memory hits never block: answer on the callback thread (measured in
  // BENCH.md: the executor hand-off and the artifact copy dominated a hit).
  if (absl::StatusOr<ArtifactPtr> hit =
          store_->MemoryHit(request->kernel(), request->arch());
      hit.ok()) {
    *response = EncodeResponse(WireBytes(*hit), v1::ARTIFACT_SOURCE_MEMORY,
                               absl::ToDoubleSeconds(absl::Now() - start));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  const absl::Time deadline = ToAbslDeadline(context->deadline());
  // The response buffer and reactor stay valid until Finish.
  executor_->Run([this, reactor, request, response, deadline, start] {
    absl::StatusOr<v1::AttentionSpec> spec = KernelStore::Resolve(request->kernel());
    if (!spec.ok()) {
      reactor->Finish(ToGrpcStatus(spec.status()));
      return;
    }
    absl::StatusOr<KernelStore::Result> result =
        store_->GetKernel(*spec, request->arch(), request->lookup_only(), deadline);
    if (!result.ok()) {
      reactor->Finish(ToGrpcStatus(result.status()));
      return;
    }
    *response = EncodeResponse(WireBytes(result->artifact), result->source,
                               absl::ToDoubleSeconds(absl::Now() - start));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::GetManifest(
    grpc::CallbackServerContext* context, const v1::GetManifestRequest* request,
    v1::Manifest* response) {
  // Planning only, no compile: cheap enough for the callback thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::AttentionSpec> spec = KernelStore::Resolve(request->kernel());
  absl::StatusOr<v1::Manifest> manifest =
      spec.ok() ? store_->GetManifest(*spec, request->arch())
                : absl::StatusOr<v1::Manifest>(spec.status());
  if (manifest.ok()) *response = *std::move(manifest);
  reactor->Finish(ToGrpcStatus(manifest.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Stats(
    grpc::CallbackServerContext* context, const v1::StatsRequest* /*request*/,
    v1::StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  *response = store_->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// Streams one PrebuildProgress per (kernel, arch) in completion order while
// `parallelism` threads run the store calls. gRPC allows one write in flight,
// so finished results queue here. Worker threads share `State` (not the
// reactor, which deletes itself in OnDone) and never call into gRPC while
// holding the mutex, since a reaction may run inline on the calling thread.
class PrebuildReactor final : public grpc::ServerWriteReactor<v1::PrebuildProgress> {
 public:
  struct Job {
    v1::AttentionSpec spec;
    std::string arch;
  };

  PrebuildReactor(KernelStore* store, std::vector<Job> jobs, absl::Time deadline)
      : state_(std::make_shared<State>()) {
    state_->store = store;
    state_->jobs = std::move(jobs);
    state_->deadline = deadline;
    state_->reactor = this;
  }

  // Call once, after construction; a request with no jobs finishes at once.
  void Start(int parallelism, std::function<void(std::function<void()>)> run) {
    const int total = static_cast<int>(state_->jobs.size());
    if (total == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    const int threads = std::max(1, std::min(parallelism, total));
    state_->running = threads;
    for (int i = 0; i < threads; ++i) {
      run([state = state_] { Work(state); });
    }
  }

  void OnWriteDone(bool ok) override {
    // Pump may finish the call, and OnDone may then run inline and delete
    // this reactor: keep the state alive by a local reference.
    std::shared_ptr<State> state = state_;
    std::unique_lock<std::mutex> lock(state->mu);
    state->writing = false;
    if (!ok) state->cancelled = true;  // the client has gone
    Pump(state, lock);
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->cancelled = true;
  }

  void OnDone() override { delete this; }

 private:
  struct State {
    KernelStore* store = nullptr;
    std::vector<Job> jobs;
    absl::Time deadline;
    PrebuildReactor* reactor = nullptr;  // valid until finished is set

    std::mutex mu;
    size_t next_job = 0;
    int running = 0;  // worker threads not yet returned
    uint32_t done = 0;
    bool writing = false;
    bool cancelled = false;
    bool finished = false;
    std::deque<v1::PrebuildProgress> pending;
    v1::PrebuildProgress in_write;  // the message of the write in flight
  };

  static void Work(const std::shared_ptr<State>& state) {
    std::unique_lock<std::mutex> lock(state->mu);
    const uint32_t total = static_cast<uint32_t>(state->jobs.size());
    while (!state->cancelled && state->next_job < state->jobs.size()) {
      const Job& job = state->jobs[state->next_job++];
      lock.unlock();
      const absl::Time start = absl::Now();
      absl::StatusOr<KernelStore::Result> result = state->store->GetKernel(
          job.spec, job.arch, /*lookup_only=*/false, state->deadline);
      v1::PrebuildProgress progress;
      progress.set_arch(job.arch);
      progress.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
      progress.set_total(total);
      if (result.ok()) {
        progress.set_key(result->artifact->key());
        progress.set_module_name(result->artifact->module_name());
        progress.set_state(StateFor(result->source));
      } else {
        progress.set_state(v1::PREBUILD_STATE_FAILED);
        progress.set_error(ToGrpcStatus(result.status()).error_message());
      }
      lock.lock();
      progress.set_done(++state->done);
      state->pending.push_back(std::move(progress));
      Pump(state, lock);  // unlocks to write, then relocks
    }
    --state->running;
    Pump(state, lock);
  }

  // Starts the next write or finishes the call, whichever is due. Called
  // with the lock held; returns with it held.
  static void Pump(const std::shared_ptr<State>& state,
                   std::unique_lock<std::mutex>& lock) {
    if (state->finished || state->writing) return;
    if (!state->cancelled && !state->pending.empty()) {
      state->writing = true;
      state->in_write = std::move(state->pending.front());
      state->pending.pop_front();
      PrebuildReactor* reactor = state->reactor;
      lock.unlock();
      reactor->StartWrite(&state->in_write);
      lock.lock();
      return;
    }
    if (state->running > 0) return;
    // Every worker has returned and no write is in flight: nothing touches
    // the reactor after this.
    state->finished = true;
    const bool cancelled = state->cancelled;
    PrebuildReactor* reactor = state->reactor;
    lock.unlock();
    reactor->Finish(cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
    lock.lock();
  }

  std::shared_ptr<State> state_;
};

}  // namespace

grpc::ServerWriteReactor<v1::PrebuildProgress>* KernelServiceImpl::Prebuild(
    grpc::CallbackServerContext* context, const v1::PrebuildRequest* request) {
  // A request that names a bad kernel or no work fails as a whole, before
  // anything is built; per-kernel build errors are progress messages.
  absl::Status bad;
  std::vector<PrebuildReactor::Job> jobs;
  if (request->kernels_size() == 0 || request->archs_size() == 0) {
    bad = absl::InvalidArgumentError(
        "Prebuild needs at least one kernel and one arch");
  }
  for (int i = 0; bad.ok() && i < request->kernels_size(); ++i) {
    absl::StatusOr<v1::AttentionSpec> spec = KernelStore::Resolve(request->kernels(i));
    if (!spec.ok()) {
      bad = absl::Status(spec.status().code(),
                         absl::StrCat("kernels[", i, "]: ", spec.status().message()));
      break;
    }
    for (const std::string& arch : request->archs()) jobs.push_back({*spec, arch});
  }
  auto* reactor = new PrebuildReactor(store_, std::move(jobs),
                                      ToAbslDeadline(context->deadline()));
  if (!bad.ok()) {
    reactor->Finish(ToGrpcStatus(bad));
    return reactor;
  }
  reactor->Start(options_.prebuild_parallelism,
                 [this](std::function<void()> task) { executor_->Run(std::move(task)); });
  return reactor;
}

}  // namespace kforge
