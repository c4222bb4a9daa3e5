#ifndef KFORGE_SERVICE_BLOCKING_EXECUTOR_H_
#define KFORGE_SERVICE_BLOCKING_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kforge {

// Runs blocking tasks (store calls that may wait for a compile) off the
// threads that must not block, such as gRPC's callback threads. Threads are
// created on demand and kept for reuse, so a cache hit does not pay for a
// thread and calls waiting on a long compile do not hold up the others (up
// to max_threads, then tasks queue). Thread-safe.
class BlockingExecutor {
 public:
  explicit BlockingExecutor(int max_threads);
  ~BlockingExecutor();  // runs the queued tasks, then joins

  BlockingExecutor(const BlockingExecutor&) = delete;
  BlockingExecutor& operator=(const BlockingExecutor&) = delete;

  void Run(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_BLOCKING_EXECUTOR_H_
