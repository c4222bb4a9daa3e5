#ifndef KFORGE_SERVICE_METRICS_H_
#define KFORGE_SERVICE_METRICS_H_

// Prometheus metrics of `kforge serve --metrics-listen`: every call counted
// and timed by a gRPC server interceptor (no handler knows about metrics),
// the store's counters and gauges, a build-info gauge, all written in the
// Prometheus text exposition format (version 0.0.4) and served over a
// minimal HTTP/1.0 endpoint.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "kforge/v1/service.pb.h"
#include "service/histogram.h"
#include "service/kernel_store.h"

namespace kforge {

// Calls by method and status code, and their latency, per method.
class RequestMetrics {
 public:
  // `method` is gRPC's full name ("/kforge.v1.KernelService/GetKernel").
  void Record(std::string_view method, int code, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // kforge_requests_total and kforge_request_seconds, in exposition format.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Methods are the server's registered ones; anything beyond this many
  // distinct names (not expected) is counted as "other", so a client
  // cannot grow the maps.
  static constexpr size_t kMaxMethods = 32;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> latency_ ABSL_GUARDED_BY(mu_);
};

// The interceptor factory that feeds `metrics` (which must outlive the
// server).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    RequestMetrics* metrics);

// The whole /metrics page: `requests`, the store's `stats` and `timings`,
// and kforge_build_info.
std::string RenderMetrics(const RequestMetrics& requests, const v1::StatsResponse& stats,
                          const KernelStore::Timings& timings);

// GET /metrics over HTTP on `listen` (HOST:PORT, port 0: any free one), one
// connection at a time on its own thread; anything else is 404. Stops when
// destroyed.
class MetricsHttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsHttpServer();
  int port() const;

 private:
  struct State;
  explicit MetricsHttpServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_METRICS_H_
