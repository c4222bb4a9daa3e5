#include "compiler/nvrtc.h"

#include <elf.h>
#include <link.h>

#include <nvrtc.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/io.h"
#include "base/sha256.h"
#include "compiler/embedded_templates.h"

namespace kforge {
namespace {

// A failed template instantiation can log megabytes (one error per
// instantiation step); the first errors name the cause and the tail holds the
// "N errors detected" summary, so keep both ends and drop the middle.
constexpr size_t kMaxLogInMessage = 64 * 1024;
constexpr size_t kLogTailKept = 8 * 1024;

// Destroys the program on every return path.
class ProgramGuard {
 public:
  explicit ProgramGuard(nvrtcProgram program) : program_(program) {}
  ProgramGuard(const ProgramGuard&) = delete;
  ProgramGuard& operator=(const ProgramGuard&) = delete;
  ~ProgramGuard() {
    if (program_ != nullptr) nvrtcDestroyProgram(&program_);
  }

 private:
  nvrtcProgram program_;
};

std::string TruncatedLog(const std::string& log) {
  if (log.size() <= kMaxLogInMessage) return log;
  const size_t head = kMaxLogInMessage - kLogTailKept;
  return absl::StrCat(log.substr(0, head),
                      absl::StrFormat("\n[... NVRTC log truncated: %d of %d bytes omitted ...]\n",
                                      log.size() - kMaxLogInMessage, log.size()),
                      log.substr(log.size() - kLogTailKept));
}

// NVRTC reports the log size including the terminating NUL.
std::string ProgramLog(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) {
    return "";
  }
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return "";
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

}  // namespace

std::vector<std::string> BaseNvrtcOptions(const std::string& arch) {
  return {
      // A real arch ("sm_90a") makes NVRTC run ptxas and emit SASS, so the
      // artifact loads without a driver JIT step. A virtual arch yields no
      // cubin and is rejected by CompileWithNvrtc.
      absl::StrCat("--gpu-architecture=", arch),
      // NVRTC 13 otherwise reads and writes the driver's compute cache
      // (~/.nv/ComputeCache) behind our back: kforge has its own
      // content-addressed cache, and a compile must really compile so its
      // log, timing and failures are genuine.
      "-no-cache",
      // By default the directory of the program name (the working directory
      // for a bare name) is searched for quoted includes, which would let a
      // stray file on the serving host shadow or extend the embedded
      // templates. With this, only the headers handed to nvrtcCreateProgram
      // resolve. (NVRTC adds no toolkit include path of its own.)
      "-no-source-include",
      // NVRTC 13's default, pinned so a future default change shows up as a
      // different option list (and so a different cache key) rather than a
      // silent dialect change.
      "-std=c++17",
      // ptxas translates a module's entries on two threads. Each entry's
      // SASS is byte-identical to a one-thread ptxas (ptxas compiles every
      // function apart: tests/nvrtc_test.cc checks it, and the behaviour
      // digest of every preset module was unchanged), and the cubin is the
      // same on every host: the count is fixed here, never the host's cores
      // (the cubin's .note.nv.tkinfo records ptxas's options, so a count
      // taken from the host would make bundles differ between hosts). Two,
      // not more: on 2 cores it took a multi-entry module's ptxas phase from
      // about 1.1 to 0.75 s for 0-7% more CPU, where 4 threads cost 3-17%
      // more CPU for no more speed (BENCH.md, "Cold compile time: ptxas on
      // two threads"), and prebuilds are CPU-bound. NVRTC's own
      // -split-compile is deliberately absent: it splits the NVVM optimizer
      // too, and that changes the code of most entries.
      "--ptxas-options=--split-compile=2",
      // Deliberately absent: -default-device (the templates annotate every
      // function, as nvcc requires, so nvcc tests catch a missing
      // __device__); -DNDEBUG (no <cassert> without toolkit headers);
      // --ptxas-options=-v (only floods the log; resources are read from the
      // cubin instead); -lineinfo / -G (callers add them as extra_options).
  };
}

absl::StatusOr<NvrtcResult> CompileWithNvrtc(const NvrtcRequest& request) {
  if (request.arch.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVRTC compile of '", request.program_name, "': no arch given"));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string program_name =
      request.program_name.empty() ? "kforge_program.cu" : request.program_name;

  NvrtcResult result;
  result.options = BaseNvrtcOptions(request.arch);
  result.options.insert(result.options.end(), request.extra_options.begin(),
                        request.extra_options.end());

  // NVRTC takes NUL-terminated strings; string_views need not be, so copy.
  const std::vector<EmbeddedFile>& headers =
      request.headers.empty() ? EmbeddedTemplates() : request.headers;
  std::vector<std::string> header_names, header_sources;
  header_names.reserve(headers.size());
  header_sources.reserve(headers.size());
  for (const EmbeddedFile& header : headers) {
    header_names.emplace_back(header.path);
    header_sources.emplace_back(header.contents);
  }
  std::vector<const char*> name_ptrs, source_ptrs, option_ptrs;
  for (const std::string& s : header_names) name_ptrs.push_back(s.c_str());
  for (const std::string& s : header_sources) source_ptrs.push_back(s.c_str());
  for (const std::string& s : result.options) option_ptrs.push_back(s.c_str());

  const std::string joined_options = absl::StrJoin(result.options, " ");
  auto failure = [&](const char* what, nvrtcResult code) {
    return absl::InternalError(absl::StrCat("NVRTC ", what, " failed for '", program_name, "' (",
                                            nvrtcGetErrorString(code),
                                            ")\noptions: ", joined_options));
  };

  nvrtcProgram program = nullptr;
  nvrtcResult rc =
      nvrtcCreateProgram(&program, request.source.c_str(), program_name.c_str(),
                         static_cast<int>(headers.size()), source_ptrs.data(), name_ptrs.data());
  if (rc != NVRTC_SUCCESS) return failure("nvrtcCreateProgram", rc);
  ProgramGuard guard(program);

  const nvrtcResult compile_rc =
      nvrtcCompileProgram(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  result.log = ProgramLog(program);
  if (compile_rc != NVRTC_SUCCESS) {
    return absl::InternalError(absl::StrCat(
        "NVRTC compile failed for '", program_name, "' (", nvrtcGetErrorString(compile_rc),
        ")\noptions: ", joined_options, "\nlog:\n", TruncatedLog(result.log)));
  }

  size_t cubin_size = 0;
  rc = nvrtcGetCUBINSize(program, &cubin_size);
  if (rc != NVRTC_SUCCESS) return failure("nvrtcGetCUBINSize", rc);
  if (cubin_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVRTC produced no cubin for '", program_name, "': arch '", request.arch,
        "' must be a real sm_XX arch, not a virtual one\n", "options: ", joined_options));
  }
  result.cubin.resize(cubin_size);
  rc = nvrtcGetCUBIN(program, result.cubin.data());
  if (rc != NVRTC_SUCCESS) return failure("nvrtcGetCUBIN", rc);

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string NvrtcVersion() {
  static const std::string* const kVersion = [] {
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
      return new std::string("unknown");
    }
    return new std::string(absl::StrCat(major, ".", minor));
  }();
  return *kVersion;
}

namespace {

struct BuildIdSearch {
  const void* symbol;    // an address inside libnvrtc
  std::string build_id;  // hex, empty until found
  std::string path;      // the object's file name
};

// dl_iterate_phdr callback: finds the loaded object that contains
// `symbol` and reads its NT_GNU_BUILD_ID note. Every note is bounds-checked
// against its segment.
int FindBuildId(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<BuildIdSearch*>(data);
  const auto target = reinterpret_cast<uintptr_t>(search->symbol);
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && target >= start && target < start + ph.p_memsz) {
      contains = true;
    }
  }
  if (!contains) return 0;
  search->path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    size_t left = ph.p_memsz;
    while (left >= sizeof(ElfW(Nhdr))) {
      ElfW(Nhdr) note;
      std::memcpy(&note, p, sizeof(note));
      const size_t name_size = (note.n_namesz + 3) & ~size_t{3};
      const size_t desc_size = (note.n_descsz + 3) & ~size_t{3};
      if (name_size > left - sizeof(note) || desc_size > left - sizeof(note) - name_size) break;
      const unsigned char* name = p + sizeof(note);
      const unsigned char* desc = name + name_size;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0) {
        search->build_id = absl::BytesToHexString(
            absl::string_view(reinterpret_cast<const char*>(desc), note.n_descsz));
        return 1;
      }
      p += sizeof(note) + name_size + desc_size;
      left -= sizeof(note) + name_size + desc_size;
    }
  }
  return 1;  // the object was found; it has no build ID
}

// libnvrtc.so is about 100 MB; a library is never near this.
constexpr uint64_t kMaxLibraryBytes = uint64_t{4} << 30;

}  // namespace

std::string NvrtcBuildIdentity() {
  static const std::string* const kIdentity = [] {
    BuildIdSearch search{reinterpret_cast<const void*>(&nvrtcVersion), "", ""};
    dl_iterate_phdr(FindBuildId, &search);
    if (!search.build_id.empty()) {
      return new std::string(absl::StrCat(NvrtcVersion(), " build-id ", search.build_id));
    }
    if (!search.path.empty()) {
      if (absl::StatusOr<std::string> bytes =
              ReadFile(search.path, kMaxLibraryBytes, Symlinks::kFollow);
          bytes.ok()) {
        return new std::string(absl::StrCat(NvrtcVersion(), " sha256 ", Sha256Hex(*bytes)));
      }
    }
    // Statically linked or unreadable: the version is all there is.
    return new std::string(absl::StrCat(NvrtcVersion(), " build unknown"));
  }();
  return *kIdentity;
}

}  // namespace kforge
