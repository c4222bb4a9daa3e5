#ifndef KFORGE_SERVICE_COMPILE_POOL_H_
#define KFORGE_SERVICE_COMPILE_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/worker.pb.h"

namespace kforge {

// Test-only fault injection into compile workers, so that tests can prove
// that a crashing or hanging worker fails only its own job. Set by tests
// (and by `kforge serve`/`prebuild`'s hidden --test-worker-* flags for the
// process-level ones); a worker gets them on its command line. 0 = off.
struct WorkerFaults {
  uint32_t crash_topk = 0;  // abort() on a job whose spec.topk is this
  uint32_t hang_topk = 0;   // sleep forever on a job whose spec.topk is this
  uint32_t fail_topk = 0;   // report a compile error on a job whose spec.topk is this

  // The worker command-line arguments that carry them; and back.
  std::vector<std::string> ToArgs() const;
  static absl::StatusOr<WorkerFaults> FromArgs(const std::vector<std::string>& args);
};

// A compile's time before the pool has timed any: BENCH.md measured 0.875 s
// median end to end through the server for glm-5 TP 8 on 2 cores (NVRTC
// 0.74-0.90 s; 0.60 s median over the 80 preset modules).
inline constexpr absl::Duration kTypicalCompile = absl::Seconds(1);
// How long a job at the back of a full default-sized queue waits for a
// worker at typical compile times. Shedding by deadline (Submit) refuses
// what would wait past its caller's deadline; this bounds the rest (callers
// without a deadline), so that a flood of them is refused, not queued for
// minutes.
inline constexpr absl::Duration kQueueWaitBudget = absl::Seconds(30);
// CompilePoolOptions::queue_limit for "follow the worker count".
inline constexpr int kAutoQueueLimit = -1;

// The default queue bound: as many jobs as `workers` get through in
// kQueueWaitBudget at `compile` each (at least one per worker); 60 for 2
// workers at 1 s.
int DefaultQueueLimit(int workers, absl::Duration compile = kTypicalCompile);

struct CompilePoolOptions {
  int workers = 1;  // concurrent worker processes
  // Jobs waiting for a busy worker; more -> ResourceExhausted. A job an idle
  // worker takes at once does not count: 0 is no waiting queue.
  // kAutoQueueLimit: DefaultQueueLimit(workers, initial_compile_estimate).
  int queue_limit = kAutoQueueLimit;
  absl::Duration timeout = absl::Seconds(120);  // per compile, then SIGKILL
  // What a compile is taken to cost until the pool has timed some (then the
  // mean of the last few runs), for the queue wait estimate.
  absl::Duration initial_compile_estimate = kTypicalCompile;
  // The kforge binary; run as `<worker_binary> compile-worker`. Empty means
  // this process's own executable (/proc/self/exe).
  std::string worker_binary;
  WorkerFaults faults;  // tests only
};

// Whether a failed job's status is the compiler's own answer (the worker
// ran and reported an error for the job, e.g. NVRTC rejected the source),
// which the same job would get again, as opposed to a crash, a timeout or
// a full queue. The pool marks such statuses with a payload.
bool IsCompilerRejection(const absl::Status& status);
// Whether a failed job's worker crashed, was killed at the timeout, exited
// non-zero or wrote no usable result: a failure of the job's run that the
// same job will likely meet again (not a full queue, a shutdown, a dropped
// job or the compiler's own answer).
bool IsWorkerFailure(const absl::Status& status);
// Whether Submit refused a job because it would have been answered after
// its deadline (ResourceExhausted, with the estimate in the message).
bool IsDeadlineShed(const absl::Status& status);
// Whether a queued job was dropped before it started because nobody waited
// for it any more (its JobInterest lapsed; DeadlineExceeded).
bool IsDroppedJob(const absl::Status& status);

// Until when somebody waits for a job's result. The submitter may extend it
// while the job waits (another caller joins); the pool never starts a job
// whose interest has lapsed, and estimates a queued job's answer against
// it. Thread-safe.
class JobInterest {
 public:
  explicit JobInterest(absl::Time until = absl::InfinitePast());
  void Extend(absl::Time until);  // to the later of the two
  absl::Time until() const;

 private:
  std::atomic<int64_t> until_ns_;  // absl::ToUnixNanos; saturates at +-infinity
};

using CompileFuture = std::shared_future<absl::StatusOr<v1::KernelArtifact>>;
// Called once with a job's result, on a pool thread (or, for a job dropped
// at shutdown, on the thread that shuts the pool down). Must not call back
// into the pool's Shutdown.
using CompileCallback = std::function<void(absl::StatusOr<v1::KernelArtifact>)>;

// Runs compiles in isolated child processes (`kforge compile-worker`, job
// on stdin, CompileResult frames on stdout), at most `workers` at a time. A worker
// that crashes, exits non-zero, writes garbage or overruns the timeout
// fails its job with a clear status (Internal / DeadlineExceeded) and the
// pool carries on. Thread-safe.
class CompilePool {
 public:
  explicit CompilePool(CompilePoolOptions options);
  ~CompilePool();  // Shutdown()

  // Queues a job. ResourceExhausted at once when queue_limit jobs are
  // already waiting; Unavailable after Shutdown().
  absl::StatusOr<CompileFuture> Submit(v1::CompileJob job);
  // The same, with the result delivered to `done` instead of a future, so
  // that no thread has to wait for it. On an error `done` is not called.
  // With an `interest`: a job that would wait for a worker is refused
  // (ResourceExhausted, IsDeadlineShed) when its estimated answer falls
  // after interest->until(): (jobs running and queued ahead of it -
  // workers + 1) x a compile's time / workers to start, plus one compile,
  // a compile's time being the mean of the last 16 runs, or the mean time
  // the running ones have run so far when that is longer. A job an idle worker
  // takes is never refused so (its result is cached for the caller's
  // retry). A queued job whose interest lapses before a worker is free is
  // never started: `done` gets DeadlineExceeded (IsDroppedJob).
  // With `first`: the worker is asked for a first answer
  // (CompileJob.first_answer), which `first` gets on the pool's thread
  // while the job goes on, where the module has one; `done` still gets the
  // final result.
  absl::Status Submit(v1::CompileJob job, CompileCallback done,
                      std::shared_ptr<const JobInterest> interest = nullptr,
                      CompileCallback first = nullptr);

  // What Submit would answer about room for a job wanted until `until` now
  // (OK, ResourceExhausted or Unavailable), for a caller that must not
  // prepare a job (take a lock file, say) that would be refused. The answer
  // can change at once.
  absl::Status CheckRoom(absl::Time until = absl::InfiniteFuture()) const;

  int queue_depth() const;  // waiting for a worker, and wanted
  int in_flight() const;    // running in a worker process now
  // A compile's time as the wait estimate takes it (see Submit).
  absl::Duration compile_estimate() const;
  int queue_limit() const;  // as configured or DefaultQueueLimit

  // Rejects new jobs, fails the queued ones with Unavailable, lets running
  // compiles finish, joins the threads.
  void Shutdown();

  // Rejects new jobs, fails the queued ones, and kills the running workers
  // within ~100 ms (their jobs fail with Unavailable); returns at once. For
  // a shutdown whose grace period is over: a hung compile must not hold
  // the process until its timeout. Shutdown() still joins afterwards.
  void Abandon();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Entry point of `kforge compile-worker [SERVER_PID] [fault flags]`: reads a
// CompileJob from stdin, compiles it in this process and writes a
// CompileResult to stdout. Exits at once if its parent is no longer
// expected_parent (> 0). Returns the process exit code.
int RunCompileWorker(int expected_parent = 0, WorkerFaults faults = {});

}  // namespace kforge

#endif  // KFORGE_SERVICE_COMPILE_POOL_H_
