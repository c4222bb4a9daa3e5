#ifndef KFORGE_SERVICE_HISTOGRAM_H_
#define KFORGE_SERVICE_HISTOGRAM_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kforge {

// Upper bounds (seconds) for latencies: a memory hit takes tens of
// microseconds, a disk or Redis hit milliseconds, a compile seconds, a Warm
// stream minutes.
inline const std::vector<double>& LatencyBuckets() {
  static const std::vector<double>* kBuckets = new std::vector<double>{
      0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 120};
  return *kBuckets;
}

// Observations counted into fixed buckets, as a Prometheus histogram
// reports them. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = LatencyBuckets())
      : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

  void Observe(double value) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < bounds_.size(); ++i) {
      if (value <= bounds_[i]) {
        ++counts_[i];
        break;
      }
    }
    ++count_;
    sum_ += value;
  }

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // observations <= bounds[i]
    uint64_t count = 0;                // all of them (the +Inf bucket)
    double sum = 0;
  };
  Snapshot Read() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Snapshot s{bounds_, counts_, count_, sum_};
    for (size_t i = 1; i < s.cumulative.size(); ++i) s.cumulative[i] += s.cumulative[i - 1];
    return s;
  }

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // not cumulative
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_HISTOGRAM_H_
