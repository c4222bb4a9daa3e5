#include "service/blocking_executor.h"

#include <utility>

namespace kforge {

BlockingExecutor::BlockingExecutor(int max_threads)
    : max_threads_(max_threads < 1 ? 1 : max_threads) {}

BlockingExecutor::~BlockingExecutor() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // No thread is started after this, so the list is final.
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void BlockingExecutor::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
  if (idle_ < static_cast<int>(tasks_.size()) && static_cast<int>(threads_.size()) < max_threads_ &&
      !stopping_) {
    threads_.emplace_back([this] { Loop(); });
  }
}

void BlockingExecutor::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(
        +[](BlockingExecutor* e)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->stopping_ || !e->tasks_.empty(); },
        this));
    --idle_;
    if (tasks_.empty()) return;  // stopping
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

}  // namespace kforge
