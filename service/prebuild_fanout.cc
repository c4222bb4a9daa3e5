#include "service/prebuild_fanout.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "model/arch.h"
#include "model/spec.h"

namespace kforge {
namespace {

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

absl::StatusOr<std::vector<PrebuildJob>> ExpandPrebuildRequest(const v1::PrebuildRequest& request,
                                                               int max_jobs) {
  if (request.kernels_size() == 0 || request.archs_size() == 0) {
    return absl::InvalidArgumentError("Prebuild needs at least one kernel and one arch");
  }
  // Both counts are below 2^31 (repeated fields), so the product fits.
  const int64_t count = int64_t{request.kernels_size()} * request.archs_size();
  if (count > max_jobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prebuild: ", request.kernels_size(), " kernels x ", request.archs_size(),
                     " archs = ", count, " jobs, more than this server's limit of ", max_jobs,
                     " per request; split the request"));
  }
  for (int i = 0; i < request.archs_size(); ++i) {
    absl::StatusOr<Arch> arch = ParseArch(request.archs(i));
    if (!arch.ok()) {
      return absl::Status(arch.status().code(),
                          absl::StrCat("archs[", i, "]: ", arch.status().message()));
    }
  }
  std::vector<PrebuildJob> jobs;
  jobs.reserve(static_cast<size_t>(count));
  for (int i = 0; i < request.kernels_size(); ++i) {
    // A spec given as such is checked here too (a preset's already is), so
    // a bad kernel fails the request rather than each of its jobs later.
    absl::StatusOr<v1::KernelSpec> spec = KernelStore::Resolve(request.kernels(i));
    if (spec.ok()) spec = NormalizeKernelSpec(*spec);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(),
                          absl::StrCat("kernels[", i, "]: ", spec.status().message()));
    }
    for (const std::string& arch : request.archs()) jobs.push_back({*spec, arch});
  }
  return jobs;
}

PrebuildFanOut::KernelGetter PrebuildFanOut::StoreGetter(KernelStore* store) {
  return [store](const PrebuildJob& job, absl::Time deadline) {
    return store->GetKernel(job.spec, job.arch, /*lookup_only=*/false, deadline);
  };
}

std::shared_ptr<PrebuildFanOut> PrebuildFanOut::Create(std::vector<PrebuildJob> jobs,
                                                       Options options, KernelGetter get,
                                                       std::function<void()> ready) {
  return std::shared_ptr<PrebuildFanOut>(
      new PrebuildFanOut(std::move(jobs), options, std::move(get), std::move(ready)));
}

PrebuildFanOut::PrebuildFanOut(std::vector<PrebuildJob> jobs, Options options, KernelGetter get,
                               std::function<void()> ready)
    : jobs_(std::move(jobs)), options_(options), get_(std::move(get)), ready_(std::move(ready)) {}

void PrebuildFanOut::Start(BlockingExecutor& executor) {
  const int total = static_cast<int>(jobs_.size());
  if (total == 0) return;
  const int workers = std::max(1, std::min(options_.parallelism, total));
  {
    absl::MutexLock lock(&mu_);
    running_ = workers;
  }
  // Each worker keeps the fan-out alive until it returns.
  for (int i = 0; i < workers; ++i) {
    executor.Run([self = shared_from_this()] { self->Work(); });
  }
}

void PrebuildFanOut::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

PrebuildFanOut::Event PrebuildFanOut::Next() {
  absl::MutexLock lock(&mu_);
  Event event;
  if (cancelled_) {
    pending_.clear();
  } else if (!pending_.empty()) {
    event.progress = std::move(pending_.front());
    pending_.pop_front();
    return event;
  }
  event.finished = running_ == 0;
  event.cancelled = event.finished && cancelled_;
  return event;
}

void PrebuildFanOut::Work() {
  const uint32_t total = static_cast<uint32_t>(jobs_.size());
  mu_.Lock();
  while (!cancelled_ && next_job_ < jobs_.size()) {
    const PrebuildJob& job = jobs_[next_job_++];
    mu_.Unlock();
    const absl::Time start = absl::Now();
    absl::StatusOr<KernelStore::Result> result = get_(job, options_.deadline);
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
      progress.set_error(std::string(result.status().message()));
    }
    mu_.Lock();
    // Numbered and queued under one lock: the queue is in `done` order.
    progress.set_done(++done_);
    pending_.push_back(std::move(progress));
    mu_.Unlock();
    ready_();
    mu_.Lock();
  }
  --running_;
  const bool last = running_ == 0;
  mu_.Unlock();
  if (last) ready_();
}

}  // namespace kforge
