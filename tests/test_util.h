#ifndef KFORGE_TESTS_TEST_UTIL_H_
#define KFORGE_TESTS_TEST_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/spec.h"

namespace kforge::testing {

// Substring check that prints both strings on failure.
inline ::testing::AssertionResult Contains(absl::string_view haystack, absl::string_view needle) {
  if (absl::StrContains(haystack, needle)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// The deepseek-v3.2 decode spec at TP 1, written out field by field (every
// field set, none left to SpecFromPreset) so tests pin exact values.
inline v1::AttentionSpec DeepseekTp1Spec() {
  v1::AttentionSpec spec;
  spec.set_num_q_heads(128);
  spec.set_kv_lora_rank(512);
  spec.set_rope_dim(64);
  spec.set_topk(2048);
  spec.set_s_q(1);
  spec.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  spec.set_page_block_size(64);
  spec.set_softmax_scale(0.135234f);
  spec.set_return_lse(true);
  return spec;
}

// A DSA indexer module's spec: 64 index heads of 128, top-k 2048, pages of
// 64 (deepseek-v3.2's indexer, written out).
inline v1::KernelSpec Indexer64Spec() {
  v1::KernelSpec spec;
  spec.mutable_dsa_indexer()->set_index_heads(64);
  spec.mutable_dsa_indexer()->set_index_head_dim(128);
  spec.mutable_dsa_indexer()->set_topk(2048);
  spec.mutable_dsa_indexer()->set_page_block_size(64);
  return spec;
}

// An artifact as the compiler would hand it over, with `cubin_bytes` of
// seeded random "cubin" (cache tests need no NVRTC).
inline std::shared_ptr<const v1::KernelArtifact> FakeArtifact(const std::string& key,
                                                              size_t cubin_bytes,
                                                              uint64_t seed = 1) {
  auto artifact = std::make_shared<v1::KernelArtifact>();
  artifact->set_format_version(kFormatVersion);
  artifact->set_key(key);
  artifact->set_module_name("sparse_mla_decode_test_" + key.substr(0, 8));
  artifact->set_arch("sm_90a");
  std::mt19937_64 rng(seed);
  std::string cubin(cubin_bytes, '\0');
  for (char& c : cubin) c = static_cast<char>(rng());
  artifact->set_cubin(std::move(cubin));
  return artifact;
}

// A real selection manifest and kernel: glm-5 at TP 8 on `arch`, the
// manifest (one variant, any s_q), the kernel its first
// choice's, compiled with NVRTC (about a second; no GPU needed). Link
// kforge_runtime to use it.
struct CompiledFirstChoice {
  v1::Manifest manifest;
  v1::KernelArtifact artifact;
};
inline absl::StatusOr<CompiledFirstChoice> CompileGlm5Tp8(const std::string& arch) {
  KernelCompiler compiler;
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  if (!spec.ok()) return spec.status();
  CompiledFirstChoice compiled;
  absl::StatusOr<v1::Manifest> manifest = BuildManifest(compiler, KernelSpecOf(*spec), arch);
  if (!manifest.ok()) return manifest.status();
  compiled.manifest = *std::move(manifest);
  absl::StatusOr<v1::KernelArtifact> artifact = compiler.Compile(KernelSpecOf(*spec), arch);
  if (!artifact.ok()) return artifact.status();
  compiled.artifact = *std::move(artifact);
  return compiled;
}

// The whole file, or "" when it cannot be read (logs, /proc entries).
inline std::string ReadFileOrEmpty(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A .text.<entry> section of an ELF64 cubin: the entry's machine code.
struct TextSection {
  std::string name;  // without ".text."
  uint64_t offset = 0, size = 0;
};

// Every .text.<entry> section of an ELF64 cubin, in section-header order,
// read by hand from the ELF header fields (tests need no libelf); sections
// whose name or bytes lie outside the file are left out.
inline std::vector<TextSection> TextSections(const std::string& elf) {
  auto le = [&elf](uint64_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && at + i < elf.size(); ++i) {
      v |= uint64_t{static_cast<unsigned char>(elf[at + i])} << (8 * i);
    }
    return v;
  };
  std::vector<TextSection> out;
  const uint64_t shoff = le(0x28, 8), shentsize = le(0x3a, 2), shnum = le(0x3c, 2);
  const uint64_t strtab = le(shoff + le(0x3e, 2) * shentsize + 24, 8);
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t sh = shoff + i * shentsize;
    const uint64_t name = strtab + le(sh, 4);
    const uint64_t offset = le(sh + 24, 8), size = le(sh + 32, 8);
    if (name >= elf.size() || elf.compare(name, 6, ".text.") != 0 || offset > elf.size() ||
        size > elf.size() - offset) {
      continue;
    }
    const uint64_t end = elf.find('\0', name);
    out.push_back(
        {elf.substr(name + 6, end == std::string::npos ? std::string::npos : end - name - 6),
         offset, size});
  }
  return out;
}

// A socket connected to 127.0.0.1:`port` whose reads time out after 5 s,
// or -1 when nothing accepts.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const timeval five = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof(five));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET `path` from 127.0.0.1:`port` over HTTP/1.0: the whole response,
// headers included ("" when nothing accepts); bounded by ConnectLoopback's
// receive timeout.
inline std::string HttpGet(int port, const std::string& path) {
  std::string response;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return response;
  const std::string request = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  close(fd);
  return response;
}

// A loopback port nothing listens on (bound, read back, released).
inline int UnusedLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot bind a loopback port";
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A fresh directory under the system temporary directory, removed with
// everything in it at the end of its scope.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "kforge_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The glm-5 preset at tensor-parallel degree `tp`.
inline v1::KernelSelector Glm5Selector(int tp) {
  v1::KernelSelector selector;
  selector.mutable_preset()->set_name("glm-5");
  selector.mutable_preset()->set_tensor_parallel(tp);
  return selector;
}

// Starts argv (argv[0] is the binary) with stdout and stderr in `log`, in
// the test's environment less its KFORGE_TEST_ variables (a server tag the
// test runs under must not leak into a child it did not mean it for) plus
// `env`.
// Returns the pid, or -1 after recording a failure.
inline pid_t SpawnWithLog(std::vector<std::string> argv, std::vector<std::string> env,
                          const std::filesystem::path& log) {
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "KFORGE_TEST_")) env.emplace_back(*e);
  }
  std::vector<char*> c_argv, c_env;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  for (std::string& e : env) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int err =
      posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << strerror(err);
    return -1;
  }
  return pid;
}

// A `kforge serve` child process listening on a free loopback port, with
// stdout and stderr in a log file; killed (with its compile workers) when
// it goes out of scope, its log printed if the test failed.
class ServeProcess {
 public:
  ServeProcess(const std::string& binary, const std::filesystem::path& cache_dir,
               const std::filesystem::path& log, std::vector<std::string> args = {},
               std::vector<std::string> env = {})
      : log_(log) {
    std::vector<std::string> argv = {binary,        "serve",       "--listen",
                                     "127.0.0.1:0", "--cache-dir", cache_dir.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    // Compile workers inherit this, so the test can find its own.
    tag_ = absl::StrCat("KFORGE_TEST_SERVER_TAG=", log.string());
    env.push_back(tag_);
    pid_ = SpawnWithLog(std::move(argv), std::move(env), log);
  }

  ~ServeProcess() {
    if (running()) {
      kill(pid_, SIGKILL);
      WaitExit(absl::Seconds(30));
    }
    KillOrphanedWorkers();
    if (::testing::Test::HasFailure()) {
      std::cerr << "---- " << log_.string() << " ----\n" << Log() << "----\n";
    }
  }

  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Waits for the "serving on" line and reads the address from it. Returns
  // false (and records a failure) if the server exits or takes too long.
  bool WaitForAddress(absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    const std::string marker = "kforge: serving on ";
    while (address_.empty()) {
      const std::string log = Log();
      const size_t at = log.find(marker);
      if (at != std::string::npos) {
        const size_t begin = at + marker.size();
        address_ = log.substr(begin, log.find(' ', begin) - begin);
        break;
      }
      if (!running() || absl::Now() > deadline) {
        ADD_FAILURE() << "server did not start; log:\n" << log;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      pid_ = -1;
      return false;
    }
    return r == 0;
  }

  void Signal(int signo) {
    ASSERT_GT(pid_, 0);
    kill(pid_, signo);
  }

  // The exit code, -signal when killed by a signal, or -1000 on timeout.
  int WaitExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (running()) {
      if (absl::Now() > deadline) return -1000;
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (WIFEXITED(exit_status_)) return WEXITSTATUS(exit_status_);
    if (WIFSIGNALED(exit_status_)) return -WTERMSIG(exit_status_);
    return -1001;
  }

  std::string Log() const { return ReadFileOrEmpty(log_); }

  // A worker spawned just before its server was SIGKILLed can miss the
  // parent-death signal (it sets PR_SET_PDEATHSIG only once running), and
  // one stuck in the hang hook would then wait forever: end this server's
  // workers, found by the tag in their environment.
  void KillOrphanedWorkers() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string environ_bytes = ReadFileOrEmpty(e.path() / "environ");
      size_t at = 0;
      for (size_t end; (end = environ_bytes.find('\0', at)) != std::string::npos; at = end + 1) {
        if (environ_bytes.compare(at, end - at, tag_) == 0) {
          kill(static_cast<pid_t>(std::stol(name)), SIGKILL);
          break;
        }
      }
    }
  }

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }

 private:
  std::filesystem::path log_;
  std::string tag_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
  std::string address_;
};

// The metrics port of a server started with --metrics-listen 127.0.0.1:0.
// The metrics line follows the start line: waited for, up to 10 s.
inline int MetricsPort(ServeProcess& server) {
  const std::string marker = "kforge: metrics on http://127.0.0.1:";
  std::string log = server.Log();
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       log.find(marker) == std::string::npos && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    log = server.Log();
  }
  const size_t at = log.find(marker);
  int port = 0;
  if (at == std::string::npos) return 0;
  const size_t begin = at + marker.size();
  return absl::SimpleAtoi(log.substr(begin, log.find('/', begin) - begin), &port) ? port : 0;
}

}  // namespace kforge::testing

#endif  // KFORGE_TESTS_TEST_UTIL_H_
