#ifndef KFORGE_SERVICE_PREBUILD_FANOUT_H_
#define KFORGE_SERVICE_PREBUILD_FANOUT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "service/blocking_executor.h"
#include "service/kernel_store.h"

namespace kforge {

// One kernel of a Prebuild request on one arch.
struct PrebuildJob {
  v1::KernelSpec spec;
  std::string arch;
};

// A Prebuild request as jobs, kernel by kernel, each on every arch. A
// request that names no work, more than `max_jobs` jobs (kernels x archs),
// an arch kforge does not build for or a bad kernel fails as a whole, before
// anything is built or expanded: InvalidArgument naming the counts and the
// limit, or the arch's / kernel's error prefixed with "archs[i]: " /
// "kernels[i]: ". The count is checked first and each arch once, so the work
// a request can cause is bounded by `max_jobs`, not by its size squared.
// Per-kernel build errors are progress messages.
absl::StatusOr<std::vector<PrebuildJob>> ExpandPrebuildRequest(const v1::PrebuildRequest& request,
                                                               int max_jobs);

// The Prebuild logic without gRPC: builds jobs through a kernel getter (the
// store's GetKernel), `parallelism` at a time on a BlockingExecutor, and
// queues one PrebuildProgress per job in completion order for a consumer
// that takes them at its own pace (a stream allows one write in flight).
// Thread-safe.
class PrebuildFanOut : public std::enable_shared_from_this<PrebuildFanOut> {
 public:
  using KernelGetter = std::function<absl::StatusOr<KernelStore::Result>(const PrebuildJob& job,
                                                                         absl::Time deadline)>;
  // KernelStore::GetKernel, compiling on a miss.
  static KernelGetter StoreGetter(KernelStore* store);

  struct Options {
    // Jobs in progress at once (each holds an executor thread while the
    // store works; the store's compile pool bounds real work).
    int parallelism = 4;
    absl::Time deadline = absl::InfiniteFuture();  // passed to every job
  };

  // `ready` is called with no lock held, on a worker's thread, after each
  // job's message is queued and once after the last worker has returned;
  // the consumer then calls Next until it gets nothing.
  static std::shared_ptr<PrebuildFanOut> Create(std::vector<PrebuildJob> jobs, Options options,
                                                KernelGetter get, std::function<void()> ready);

  // Schedules the workers; once only. A fan-out with no jobs is finished at
  // once.
  void Start(BlockingExecutor& executor);

  // Starts no further job (the consumer has gone); the running ones finish
  // and their messages are dropped.
  void Cancel();

  struct Event {
    std::optional<v1::PrebuildProgress> progress;  // the next message
    bool finished = false;                         // no message will follow: every worker returned
    bool cancelled = false;                        // with finished: Cancel was called
  };
  // The next message if one is queued; else finished once every worker has
  // returned; else neither (wait for `ready`).
  Event Next();

 private:
  PrebuildFanOut(std::vector<PrebuildJob> jobs, Options options, KernelGetter get,
                 std::function<void()> ready);
  void Work();

  const std::vector<PrebuildJob> jobs_;
  const Options options_;
  const KernelGetter get_;
  const std::function<void()> ready_;

  absl::Mutex mu_;
  size_t next_job_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // workers not yet returned
  uint32_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::PrebuildProgress> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_PREBUILD_FANOUT_H_
