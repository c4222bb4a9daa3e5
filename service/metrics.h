#ifndef KFORGE_SERVICE_METRICS_H_
#define KFORGE_SERVICE_METRICS_H_

// Prometheus metrics of `kforge serve --metrics-listen`: every call counted
// and timed by a gRPC server interceptor (no handler knows about metrics),
// the store's counters and gauges, a build-info gauge, all written in the
// Prometheus text exposition format (version 0.0.4) and served over a
// minimal HTTP/1.0 endpoint that one slow or idle client cannot block.

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
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "kforge/v1/service.pb.h"
#include "service/auth.h"
#include "service/histogram.h"
#include "service/kernel_store.h"

namespace kforge {

// Calls by method and status code, and their latency, per method.
class RequestMetrics {
 public:
  // `method` is gRPC's full name ("/kforge.v1.KernelService/GetKernel").
  // A method the server does not serve is counted as rpc="unknown": the
  // name is the client's choice and never becomes a label value.
  void Record(std::string_view method, int code, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // kforge_requests_total and kforge_request_seconds, in exposition format.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> latency_ ABSL_GUARDED_BY(mu_);
};

// The interceptor factory that feeds `metrics` (which must outlive the
// server).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    RequestMetrics* metrics);

// The label a call of `method` (gRPC's full name) is counted under: the
// method name for KernelService ("GetKernel"), the full name less its slash
// for the health and reflection services, "unknown" for anything else.
std::string MethodLabel(std::string_view method);

// The whole /metrics page: `requests`, the calls refused by the token check
// (`auth_failures`, by reason; all zero without token files), the store's
// `stats` and `timings`, and kforge_build_info.
std::string RenderMetrics(const RequestMetrics& requests, const AuthFailureCounts& auth_failures,
                          const v1::StatsResponse& stats, const KernelStore::Timings& timings);

// Limits of the metrics endpoint. A scraper sends its whole request at once
// and reads a page of a few KB; anything slower is a client to drop.
struct MetricsHttpLimits {
  // From accept to the end of the request's headers (not reset by each
  // byte, so trickling a byte at a time does not extend it).
  absl::Duration read_timeout = absl::Seconds(5);
  // To send the whole answer.
  absl::Duration write_timeout = absl::Seconds(10);
  // Connections held at once; a new one beyond it drops the oldest that
  // has not finished its request (a scraper's request arrives whole).
  int max_connections = 64;
  // A request's headers larger than this are refused (431).
  size_t max_request_bytes = 8192;
};

// GET /metrics over HTTP on `listen` (HOST:PORT, port 0: any free one);
// anything else is 404. One thread serves every connection with poll(), so
// a slow or silent client delays no other. Stops when destroyed.
class MetricsHttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render,
      MetricsHttpLimits limits = {});
  ~MetricsHttpServer();
  int port() const;

 private:
  struct State;
  explicit MetricsHttpServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_METRICS_H_
