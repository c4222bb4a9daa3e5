#include "service/metrics.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/absl_compat.h"
#include "base/io.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "grpcpp/support/status.h"
#include "kforge/v1/service.grpc.pb.h"

namespace kforge {
namespace {

constexpr std::string_view kServicePrefix = "/kforge.v1.KernelService/";
// The other services the server registers (gRPC's health checking and
// server reflection), whose methods are counted by their full name.
constexpr std::string_view kOtherMethods[] = {
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
};

// Prometheus label values escape backslash, quote and newline.
std::string LabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(RequestMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->Record(method_, methods->GetSendStatus().error_code(),
                       absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  RequestMetrics* metrics_;
  std::string method_;
  absl::Time start_;
};

class MetricsInterceptorFactoryImpl : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactoryImpl(RequestMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info->method() == nullptr ? "" : info->method());
  }

 private:
  RequestMetrics* metrics_;
};

const char* CodeName(int code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? kNames[code] : "UNKNOWN";
}

// The sample lines of one histogram; `labels` is "" or `key="value",`.
void AppendHistogram(std::string& out, std::string_view name, const std::string& labels,
                     const Histogram::Snapshot& h) {
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    absl::StrAppend(&out, AsAbsl(name), "_bucket{", labels, "le=\"", h.bounds[i], "\"} ",
                    h.cumulative[i], "\n");
  }
  const std::string plain =
      labels.empty() ? "" : absl::StrCat("{", labels.substr(0, labels.size() - 1), "}");
  absl::StrAppend(&out, AsAbsl(name), "_bucket{", labels, "le=\"+Inf\"} ", h.count, "\n",
                  AsAbsl(name), "_sum", plain, " ", absl::StrFormat("%.6f", h.sum), "\n",
                  AsAbsl(name), "_count", plain, " ", h.count, "\n");
}

// One metric family: its HELP and TYPE lines and samples.
void Family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  absl::StrAppend(&out, "# HELP ", AsAbsl(name), " ", AsAbsl(help), "\n# TYPE ", AsAbsl(name), " ",
                  AsAbsl(type), "\n");
}

}  // namespace

std::string MethodLabel(std::string_view method) {
  if (absl::StartsWith(AsAbsl(method), AsAbsl(kServicePrefix))) {
    const std::string_view name = method.substr(kServicePrefix.size());
    // The service's own methods, from its descriptor: a new RPC is
    // counted by name without a list to keep up to date here.
    if (v1::GetKernelRequest::descriptor()->file()->pool()->FindMethodByName(
            absl::StrCat(v1::KernelService::service_full_name(), ".", AsAbsl(name))) != nullptr) {
      return std::string(name);
    }
  }
  for (std::string_view known : kOtherMethods) {
    if (method == known) return std::string(method.substr(1));
  }
  return "unknown";
}

void RequestMetrics::Record(std::string_view method, int code, double seconds) {
  const std::string label = MethodLabel(method);
  absl::MutexLock lock(&mu_);
  ++calls_[{label, code}];
  latency_.try_emplace(label).first->second.Observe(seconds);
}

std::string RequestMetrics::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  Family(out, "kforge_requests_total", "counter", "gRPC calls answered, by method and status code");
  for (const auto& [key, n] : calls_) {
    absl::StrAppend(&out, "kforge_requests_total{rpc=\"", LabelValue(key.first), "\",code=\"",
                    CodeName(key.second), "\"} ", n, "\n");
  }
  Family(out, "kforge_request_seconds", "histogram", "gRPC call latency, by method");
  for (const auto& [method, h] : latency_) {
    AppendHistogram(out, "kforge_request_seconds",
                    absl::StrCat("rpc=\"", LabelValue(method), "\","), h.Read());
  }
  return out;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    RequestMetrics* metrics) {
  return std::make_unique<MetricsInterceptorFactoryImpl>(metrics);
}

std::string RenderMetrics(const RequestMetrics& requests, const AuthFailureCounts& auth_failures,
                          const v1::StatsResponse& s, const KernelStore::Timings& timings) {
  std::string out = requests.Render();
  Family(out, "kforge_auth_failures_total", "counter",
         "calls the bearer-token check refused, by reason");
  absl::StrAppend(
      &out, "kforge_auth_failures_total{reason=\"missing_token\"} ", auth_failures.missing_token,
      "\n", "kforge_auth_failures_total{reason=\"unknown_token\"} ", auth_failures.unknown_token,
      "\n", "kforge_auth_failures_total{reason=\"not_admin\"} ", auth_failures.not_admin, "\n");
  Family(out, "kforge_kernel_seconds", "histogram",
         "time to answer a kernel, by where it came from (GetKernel inside the server)");
  for (const auto& [source, h] : timings.by_source) {
    AppendHistogram(out, "kforge_kernel_seconds", absl::StrCat("source=\"", source, "\","), h);
  }
  Family(out, "kforge_compile_seconds", "histogram", "NVRTC seconds per successful compile");
  AppendHistogram(out, "kforge_compile_seconds", "", timings.compile_seconds);
  Family(out, "kforge_cache_hits_total", "counter", "kernels answered from a cache tier");
  absl::StrAppend(&out, "kforge_cache_hits_total{tier=\"memory\"} ", s.memory_hits(), "\n",
                  "kforge_cache_hits_total{tier=\"disk\"} ", s.disk_hits(), "\n",
                  "kforge_cache_hits_total{tier=\"redis\"} ", s.redis_hits(), "\n");
  Family(out, "kforge_cache_bytes", "gauge", "bytes held by a local cache tier");
  absl::StrAppend(&out, "kforge_cache_bytes{tier=\"memory\"} ", s.memory_bytes(), "\n",
                  "kforge_cache_bytes{tier=\"disk\"} ", s.disk_bytes(), "\n");
  Family(out, "kforge_cache_entries", "gauge", "kernels held by a local cache tier");
  absl::StrAppend(&out, "kforge_cache_entries{tier=\"memory\"} ", s.memory_entries(), "\n",
                  "kforge_cache_entries{tier=\"disk\"} ", s.disk_entries(), "\n");
  Family(out, "kforge_corrupt_entries_total", "counter",
         "stored kernels that failed verification and were dropped, by tier");
  absl::StrAppend(&out, "kforge_corrupt_entries_total{tier=\"local\"} ", s.corrupt_entries(), "\n",
                  "kforge_corrupt_entries_total{tier=\"redis\"} ", s.redis_corrupt_entries(), "\n");
  Family(out, "kforge_untrusted_entries_total", "counter",
         "stored kernels dropped because they were not written with the fleet key (or came "
         "from an unsigned bundle under --trust), by tier");
  absl::StrAppend(
      &out, "kforge_untrusted_entries_total{tier=\"disk\"} ", s.disk_untrusted_entries(), "\n",
      "kforge_untrusted_entries_total{tier=\"redis\"} ", s.redis_untrusted_entries(), "\n");
  Family(out, "kforge_rejected_artifacts_total", "counter",
         "stored kernels that decoded but failed the server's artifact check (key, arch, ELF, "
         "entries, sizes) and were dropped, by tier");
  absl::StrAppend(
      &out, "kforge_rejected_artifacts_total{tier=\"disk\"} ", s.disk_rejected_artifacts(), "\n",
      "kforge_rejected_artifacts_total{tier=\"redis\"} ", s.redis_rejected_artifacts(), "\n");
  struct Counter {
    const char* name;
    uint64_t value;
    const char* help;
  };
  for (const Counter& c : {
           Counter{"kforge_misses_total", s.misses(), "requests no cache tier answered"},
           Counter{"kforge_compiles_total", s.compiles(), "compiles started"},
           Counter{"kforge_compile_failures_total", s.compile_failures(), "compiles that failed"},
           Counter{"kforge_shared_compile_waits_total", s.shared_compile_waits(),
                   "requests that joined another request's compile"},
           Counter{"kforge_rejected_queue_full_total", s.rejected_queue_full(),
                   "compiles refused because the queue was full"},
           Counter{"kforge_rejected_deadline_total", s.rejected_deadline(),
                   "compiles refused because they would have waited past their deadline"},
           Counter{"kforge_compiles_dropped_total", s.compiles_dropped(),
                   "queued compiles never started because every caller had gone"},
           Counter{"kforge_first_answers_total", s.first_answers(),
                   "requests answered with a first answer while the rest compiled"},
           Counter{"kforge_disk_write_failures_total", s.disk_write_failures(),
                   "compiled kernels the disk tier could not store"},
           Counter{"kforge_redis_errors_total", s.redis_errors(),
                   "Redis timeouts, refused connections and error replies"},
           Counter{"kforge_redis_skipped_total", s.redis_skipped(),
                   "Redis calls not made because Redis was down"},
           Counter{"kforge_redis_lock_waits_total", s.redis_lock_waits(),
                   "misses that waited for another server's compile"},
           Counter{"kforge_redis_local_compiles_total", s.redis_local_compiles(),
                   "misses compiled without the fleet lock (Redis down or slow)"},
       }) {
    Family(out, c.name, "counter", c.help);
    absl::StrAppend(&out, c.name, " ", c.value, "\n");
  }
  for (const Counter& g : {
           Counter{"kforge_queue_depth", s.queue_depth(), "compiles waiting for a worker"},
           Counter{"kforge_in_flight_compiles", s.in_flight_compiles(), "compiles running"},
           Counter{"kforge_redis_up", s.redis_up(), "1 while Redis is reachable"},
       }) {
    Family(out, g.name, "gauge", g.help);
    absl::StrAppend(&out, g.name, " ", g.value, "\n");
  }
  Family(out, "kforge_build_info", "gauge", "what decides the kernels this server builds");
  absl::StrAppend(&out, "kforge_build_info{version=\"", LabelValue(KforgeVersion()), "\",nvrtc=\"",
                  LabelValue(NvrtcVersion()), "\",template_digest=\"", LabelValue(TemplateDigest()),
                  "\"} 1\n");
  return out;
}

struct MetricsHttpServer::State {
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  int port = 0;
  MetricsHttpLimits limits;
  std::function<std::string()> render;
  std::thread thread;

  // One client: its request while reading, then the answer while writing.
  struct Connection {
    int fd = -1;
    std::string request;
    std::string response;  // non-empty once the request is read
    size_t sent = 0;
    absl::Time accepted;
    absl::Time deadline;
  };
  // Touched by the serving thread only.
  std::vector<Connection> connections;

  void Serve() {
    std::vector<pollfd> fds;
    for (;;) {
      const absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      fds.clear();
      fds.push_back({stop_pipe[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Connection& c : connections) {
        fds.push_back({c.fd, static_cast<short>(c.response.empty() ? POLLIN : POLLOUT), 0});
        next = std::min(next, c.deadline);
      }
      const int timeout_ms =
          next == absl::InfiniteFuture()
              ? -1
              : static_cast<int>(std::max<int64_t>(
                    0, absl::ToInt64Milliseconds(absl::Ceil(next - now, absl::Milliseconds(1)))));
      if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents != 0) break;
      // Connections first: those accepted below have no revents yet.
      for (size_t i = 0; i < connections.size(); ++i) {
        if (fds[i + 2].revents != 0) Step(connections[i]);
      }
      const absl::Time after = absl::Now();
      for (Connection& c : connections) {
        if (c.fd >= 0 && after >= c.deadline) Drop(c);
      }
      connections.erase(std::remove_if(connections.begin(), connections.end(),
                                       [](const Connection& c) { return c.fd < 0; }),
                        connections.end());
      if (fds[1].revents != 0) AcceptAll(after);
    }
    for (Connection& c : connections) Drop(c);
  }

  void AcceptAll(absl::Time now) {
    for (;;) {
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left; anything else: try at the next poll
      if (static_cast<int>(connections.size()) >= limits.max_connections) {
        // The oldest client still sending its request makes room; with
        // every slot answering, the new one waits for none and is closed.
        auto oldest = connections.end();
        for (auto it = connections.begin(); it != connections.end(); ++it) {
          if (it->response.empty() &&
              (oldest == connections.end() || it->accepted < oldest->accepted)) {
            oldest = it;
          }
        }
        if (oldest == connections.end()) {
          close(fd);
          continue;
        }
        Drop(*oldest);
        connections.erase(oldest);
      }
      connections.push_back({fd, "", "", 0, now, now + limits.read_timeout});
    }
  }

  static void Drop(Connection& c) {
    close(c.fd);
    c.fd = -1;
  }

  // Reads what there is, or sends what it can, without blocking.
  void Step(Connection& c) {
    if (c.response.empty()) {
      char buf[2048];
      const ssize_t n = read(c.fd, buf, sizeof(buf));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        Drop(c);
        return;
      }
      if (n > 0) c.request.append(buf, static_cast<size_t>(n));
      if (c.request.find("\r\n\r\n") != std::string::npos) {
        Respond(c);
      } else if (c.request.size() > limits.max_request_bytes) {
        c.response = Response("431 Request Header Fields Too Large", "request too large\n");
        c.deadline = absl::Now() + limits.write_timeout;
      }
      if (c.response.empty()) return;
    }
    while (c.sent < c.response.size()) {
      const ssize_t n =
          send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n <= 0) {
        Drop(c);
        return;
      }
      c.sent += static_cast<size_t>(n);
    }
    // The whole answer is out: HTTP/1.0, one request per connection.
    shutdown(c.fd, SHUT_WR);
    Drop(c);
  }

  void Respond(Connection& c) {
    if (absl::StartsWith(c.request, "GET /metrics ") ||
        absl::StartsWith(c.request, "GET /metrics?")) {
      c.response = Response("200 OK", render());
    } else {
      c.response = Response("404 Not Found", "not found: GET /metrics\n");
    }
    c.deadline = absl::Now() + limits.write_timeout;
  }

  static std::string Response(std::string_view status, std::string_view body) {
    return absl::StrCat("HTTP/1.0 ", AsAbsl(status),
                        "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                        "Content-Length: ",
                        body.size(), "\r\nConnection: close\r\n\r\n", AsAbsl(body));
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render, MetricsHttpLimits limits) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: got \"", listen,
                                                   "\", expected HOST:PORT with a port 0..65535"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int err =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": ", gai_strerror(err)));
  }
  auto state = std::make_unique<State>();
  state->render = std::move(render);
  state->limits = limits;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    freeaddrinfo(found);
    if (fd >= 0) close(fd);
    return ErrnoStatus(err, "cannot listen for metrics on", listen);
  }
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  state->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  state->listen_fd = fd;
  if (pipe2(state->stop_pipe, O_CLOEXEC) != 0) {
    close(fd);
    return ErrnoStatus(errno, "cannot create a pipe for", "the metrics server");
  }
  State* s = state.get();
  state->thread = std::thread([s] { s->Serve(); });
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(state)));
}

MetricsHttpServer::~MetricsHttpServer() {
  const char stop = 1;
  (void)!write(state_->stop_pipe[1], &stop, 1);
  state_->thread.join();
  close(state_->listen_fd);
  close(state_->stop_pipe[0]);
  close(state_->stop_pipe[1]);
}

int MetricsHttpServer::port() const { return state_->port; }

}  // namespace kforge
