#include "model/cubin.h"

#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"

namespace kforge {
namespace {

// One kernel per attribute InspectCubin reads, plus a device function that
// must not be reported as an entry.
constexpr char kKernels[] = R"(
struct Params200 { float v[50]; };  // 200 bytes, passed by value

__device__ __noinline__ float helper(float x) { return x * x + 1.0f; }

// Many values live at once: high register pressure.
extern "C" __global__ void k_pressure(const float* in, float* out) {
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = in[threadIdx.x + i * 1024];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = acc[i] * acc[(i + 7) & 31] + 1.0f;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) sum += acc[i];
  out[threadIdx.x] = helper(sum);
}

extern "C" __global__ void k_smem(float* out) {
  __shared__ float buf[1000];  // 4000 bytes
  buf[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 1000];
}

// 200-byte struct at offset 0, then an 8-byte pointer: 208 parameter bytes.
extern "C" __global__ void k_param(Params200 p, float* out) {
  float sum = 0.0f;
  for (int i = 0; i < 50; ++i) sum += p.v[i];
  out[threadIdx.x] = sum;
}

extern "C" __global__ void __launch_bounds__(256, 1) k_bounds(float* out) {
  out[threadIdx.x] = 1.0f;
}

// Indexed at run time, so the array lives in local memory (1024 bytes).
extern "C" __global__ void k_stack(float* out, int idx) {
  float arr[256];
  for (int i = 0; i < 256; ++i) arr[i] = out[i * 7 + threadIdx.x];
  arr[idx & 255] += 1.0f;
  out[threadIdx.x] = arr[(idx * 3) & 255];
}

extern "C" __global__ void k_none() {}
)";

constexpr char kTrivialKernel[] = R"(
extern "C" __global__ void trivial(float* out) { out[threadIdx.x] = 1.0f; }
)";

struct Compiled {
  std::string cubin;
  std::string log;
};

// Compiles straight to cubin with ptxas -v, whose report lands in the log.
Compiled Compile(const std::string& source, const std::string& arch) {
  Compiled compiled;
  nvrtcProgram program = nullptr;
  if (nvrtcCreateProgram(&program, source.c_str(), "cubin_test.cu", 0, nullptr, nullptr) !=
      NVRTC_SUCCESS) {
    ADD_FAILURE() << "nvrtcCreateProgram failed";
    return compiled;
  }
  const std::string arch_option = "--gpu-architecture=" + arch;
  const char* options[] = {arch_option.c_str(), "--ptxas-options=-v"};
  const nvrtcResult result = nvrtcCompileProgram(program, 2, options);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  compiled.log.resize(log_size);
  nvrtcGetProgramLog(program, compiled.log.data());
  if (result != NVRTC_SUCCESS) {
    ADD_FAILURE() << "NVRTC failed for " << arch << ": " << nvrtcGetErrorString(result) << "\n"
                  << compiled.log;
  } else {
    size_t cubin_size = 0;
    nvrtcGetCUBINSize(program, &cubin_size);
    compiled.cubin.resize(cubin_size);
    nvrtcGetCUBIN(program, compiled.cubin.data());
  }
  nvrtcDestroyProgram(&program);
  return compiled;
}

struct PtxasReport {
  int registers = -1;
  int smem_bytes = 0;
  int stack_frame_bytes = -1;
};

// The number just before `suffix` in `line` ("4000" for " bytes smem"), or
// -1 when `suffix` is absent.
int NumberBefore(const std::string& line, const std::string& suffix) {
  const size_t end = line.find(suffix);
  if (end == std::string::npos) return -1;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) {
    --begin;
  }
  return begin == end ? -1 : std::stoi(line.substr(begin, end - begin));
}

// The text after `prefix` up to the first of `stop` (or the line's end), or
// "" when `prefix` is absent.
std::string TextAfter(const std::string& line, const std::string& prefix, const std::string& stop) {
  const size_t at = line.find(prefix);
  if (at == std::string::npos) return "";
  const size_t begin = at + prefix.size();
  return line.substr(begin, line.find_first_of(stop, begin) - begin);
}

// Reads ptxas -v output:
//   ptxas info    : Compiling entry function 'k_smem' for 'sm_90a'
//   ptxas info    : Function properties for k_smem
//   ptxas         .     0 bytes stack frame, 0 bytes spill stores, ...
//   ptxas info    : Used 12 registers, used 1 barriers, 4000 bytes smem
std::map<std::string, PtxasReport> ParsePtxasLog(const std::string& log) {
  std::map<std::string, PtxasReport> reports;
  std::string entry;
  std::string properties;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (std::string name = TextAfter(line, "Compiling entry function '", "'"); !name.empty()) {
      entry = name;
    } else if (std::string name = TextAfter(line, "Function properties for ", " \n");
               !name.empty()) {
      properties = name;
    } else if (int frame = NumberBefore(line, " bytes stack frame"); frame >= 0) {
      reports[properties].stack_frame_bytes = frame;
    } else if (int registers = NumberBefore(line, " registers");
               registers >= 0 && line.find("Used ") != std::string::npos) {
      reports[entry].registers = registers;
      reports[entry].smem_bytes = std::max(0, NumberBefore(line, " bytes smem"));
    }
  }
  return reports;
}

const v1::KernelResources* FindKernel(const v1::CubinInfo& info, const std::string& name) {
  for (const v1::KernelResources& kernel : info.kernels()) {
    if (kernel.name() == name) return &kernel;
  }
  return nullptr;
}

// A minimal ELF64 section lookup, independent of the code under test, for
// aiming corruptions at particular records.
struct RawSection {
  size_t header_offset = 0;  // where the section header sits in the file
  uint64_t offset = 0;       // sh_offset
  uint64_t size = 0;         // sh_size
};

template <typename T>
T Load(const std::string& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

std::optional<RawSection> FindRawSection(const std::string& bytes, const std::string& name) {
  const auto shoff = Load<uint64_t>(bytes, 0x28);
  const auto shentsize = Load<uint16_t>(bytes, 0x3a);
  const auto shnum = Load<uint16_t>(bytes, 0x3c);
  const auto shstrndx = Load<uint16_t>(bytes, 0x3e);
  const auto strtab = Load<uint64_t>(bytes, shoff + shstrndx * shentsize + 0x18);
  for (size_t i = 0; i < shnum; ++i) {
    const size_t header = shoff + i * shentsize;
    const auto name_offset = Load<uint32_t>(bytes, header);
    if (std::strcmp(bytes.c_str() + strtab + name_offset, name.c_str()) == 0) {
      return RawSection{header, Load<uint64_t>(bytes, header + 0x18),
                        Load<uint64_t>(bytes, header + 0x20)};
    }
  }
  return std::nullopt;
}

// The file offset of the first record with `attribute` in an attribute
// section.
std::optional<size_t> FindRecord(const std::string& bytes, const RawSection& section,
                                 uint8_t attribute) {
  size_t at = section.offset;
  while (at + 4 <= section.offset + section.size) {
    if (static_cast<uint8_t>(bytes[at + 1]) == attribute) return at;
    const uint8_t format = bytes[at];
    at += 4 + (format == 0x04 ? Load<uint16_t>(bytes, at + 2) : 0);
  }
  return std::nullopt;
}

bool IsOkOrInvalidArgument(const absl::Status& status) {
  return status.ok() || status.code() == absl::StatusCode::kInvalidArgument;
}

class CubinResourcesTest : public testing::TestWithParam<const char*> {};

TEST_P(CubinResourcesTest, MatchesPtxasReport) {
  const std::string arch = GetParam();
  const Compiled compiled = Compile(kKernels, arch);
  ASSERT_FALSE(compiled.cubin.empty());
  const std::map<std::string, PtxasReport> ptxas = ParsePtxasLog(compiled.log);

  absl::StatusOr<v1::CubinInfo> info = InspectCubin(compiled.cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch(), arch);
  EXPECT_EQ(info->elf_abi_version(),
            static_cast<uint8_t>(compiled.cubin[8]));  // EI_ABIVERSION

  std::vector<std::string> names;
  for (const v1::KernelResources& kernel : info->kernels()) {
    names.push_back(kernel.name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"k_bounds", "k_none", "k_param", "k_pressure",
                                             "k_smem", "k_stack"}));

  for (const v1::KernelResources& kernel : info->kernels()) {
    SCOPED_TRACE(kernel.name());
    auto report = ptxas.find(kernel.name());
    ASSERT_NE(report, ptxas.end()) << compiled.log;
    EXPECT_GT(kernel.registers(), 0u);
    EXPECT_EQ(kernel.registers(), report->second.registers);
    EXPECT_EQ(kernel.static_smem_bytes(), report->second.smem_bytes);
    EXPECT_EQ(kernel.local_bytes(), report->second.stack_frame_bytes);
  }

  const v1::KernelResources* pressure = FindKernel(*info, "k_pressure");
  ASSERT_NE(pressure, nullptr);
  EXPECT_GE(pressure->registers(), 32u);
  EXPECT_EQ(pressure->param_bytes(), 16u);

  const v1::KernelResources* smem = FindKernel(*info, "k_smem");
  ASSERT_NE(smem, nullptr);
  EXPECT_EQ(smem->static_smem_bytes(), 4000u);
  EXPECT_EQ(smem->max_threads(), 0u);

  const v1::KernelResources* param = FindKernel(*info, "k_param");
  ASSERT_NE(param, nullptr);
  EXPECT_EQ(param->param_bytes(), 208u);

  const v1::KernelResources* bounds = FindKernel(*info, "k_bounds");
  ASSERT_NE(bounds, nullptr);
  EXPECT_EQ(bounds->max_threads(), 256u);
  EXPECT_EQ(bounds->param_bytes(), 8u);

  const v1::KernelResources* stack = FindKernel(*info, "k_stack");
  ASSERT_NE(stack, nullptr);
  EXPECT_EQ(stack->local_bytes(), 1024u);
  EXPECT_EQ(stack->param_bytes(), 12u);

  const v1::KernelResources* none = FindKernel(*info, "k_none");
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->param_bytes(), 0u);
  EXPECT_EQ(none->static_smem_bytes(), 0u);
  EXPECT_EQ(none->local_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Archs, CubinResourcesTest,
                         testing::Values("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a",
                                         "sm_121a"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

TEST(CubinTest, ArchNames) {
  // NVRTC target -> name read back. An "f" target compiles to the same cubin
  // as the base target, so it reads as the base.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sm_80", "sm_80"},     {"sm_86", "sm_86"},   {"sm_89", "sm_89"},     {"sm_90", "sm_90"},
      {"sm_90a", "sm_90a"},   {"sm_100", "sm_100"}, {"sm_100a", "sm_100a"}, {"sm_100f", "sm_100"},
      {"sm_103a", "sm_103a"}, {"sm_120", "sm_120"}, {"sm_120a", "sm_120a"}, {"sm_121a", "sm_121a"},
  };
  for (const auto& [target, want] : cases) {
    SCOPED_TRACE(target);
    const Compiled compiled = Compile(kTrivialKernel, target);
    ASSERT_FALSE(compiled.cubin.empty());
    absl::StatusOr<v1::CubinInfo> info = InspectCubin(compiled.cubin);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->arch(), want);
    ASSERT_EQ(info->kernels_size(), 1);
    EXPECT_EQ(info->kernels(0).name(), "trivial");
  }
}

void SetFlags(std::string& cubin, uint8_t abi_version, uint32_t flags) {
  cubin[8] = static_cast<char>(abi_version);
  std::memcpy(cubin.data() + 0x30, &flags, sizeof(flags));
}

TEST(CubinTest, ReadsPreCuda13FlagLayout) {
  // EI_ABIVERSION 7 keeps the SM in the low byte, "a" in bit 11, e.g.
  // CUDA 12's sm_90a: EF_CUDA_SM90 | TEXMODE_UNIFIED | 64BIT_ADDRESS |
  // ACCELERATORS | VIRTUAL_SM(90). The sm_80 cubin has no .nv.compat, so
  // only e_flags speaks.
  std::string cubin = Compile(kTrivialKernel, "sm_80").cubin;
  ASSERT_FALSE(cubin.empty());
  SetFlags(cubin, 7, 0x005a0d5a);
  absl::StatusOr<v1::CubinInfo> info = InspectCubin(cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch(), "sm_90a");
  EXPECT_EQ(info->elf_abi_version(), 7u);

  SetFlags(cubin, 7, 0x00500550);
  info = InspectCubin(cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch(), "sm_80");
}

TEST(CubinTest, ReadsAcceleratorBitOfNewLayout) {
  std::string cubin = Compile(kTrivialKernel, "sm_100").cubin;
  ASSERT_FALSE(cubin.empty());
  uint32_t flags = Load<uint32_t>(cubin, 0x30);
  SetFlags(cubin, 8, flags | 0x8);
  absl::StatusOr<v1::CubinInfo> info = InspectCubin(cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch(), "sm_100a");
}

TEST(CubinTest, RejectsNonCudaElf) {
  const std::string cubin = Compile(kTrivialKernel, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());

  std::vector<std::string> inputs = {"", "hello, world",
                                     std::string("\x7f"
                                                 "ELF",
                                                 4)};
  std::string elf32 = cubin;
  elf32[4] = 1;  // ELFCLASS32
  inputs.push_back(elf32);
  std::string big_endian = cubin;
  big_endian[5] = 2;  // ELFDATA2MSB
  inputs.push_back(big_endian);
  std::string x86 = cubin;
  const uint16_t em_x86_64 = 62;
  std::memcpy(x86.data() + 18, &em_x86_64, sizeof(em_x86_64));
  inputs.push_back(x86);
  inputs.push_back(cubin.substr(0, 40));  // magic intact, header cut

  for (const std::string& input : inputs) {
    absl::StatusOr<v1::CubinInfo> info = InspectCubin(input);
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
    EXPECT_NE(info.status().message().find("not a CUDA ELF"), std::string::npos) << info.status();
  }
}

TEST(CubinTest, TruncatedInputNeverCrashes) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    SCOPED_TRACE(arch);
    const std::string cubin = Compile(kKernels, arch).cubin;
    ASSERT_FALSE(cubin.empty());
    ASSERT_TRUE(InspectCubin(cubin).ok());
    // Everything InspectCubin reads lies before the end of the section
    // header table; cutting there or earlier must fail cleanly.
    const size_t table_end = Load<uint64_t>(cubin, 0x28) +
                             size_t{Load<uint16_t>(cubin, 0x3a)} * Load<uint16_t>(cubin, 0x3c);
    for (size_t size = 0; size < cubin.size(); ++size) {
      absl::StatusOr<v1::CubinInfo> info = InspectCubin(std::string_view(cubin).substr(0, size));
      if (size < table_end) {
        ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument)
            << "cut at " << size << ": " << info.status();
      } else {
        ASSERT_TRUE(IsOkOrInvalidArgument(info.status()))
            << "cut at " << size << ": " << info.status();
      }
    }
  }
}

TEST(CubinTest, CorruptedInputNeverCrashes) {
  const std::string cubin = Compile(kKernels, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  // Every single byte inverted in turn.
  for (size_t at = 0; at < cubin.size(); ++at) {
    std::string corrupted = cubin;
    corrupted[at] = static_cast<char>(~corrupted[at]);
    absl::StatusOr<v1::CubinInfo> info = InspectCubin(corrupted);
    ASSERT_TRUE(IsOkOrInvalidArgument(info.status())) << "byte " << at << ": " << info.status();
  }
  // Bursts of random bytes, seeded for reproducibility.
  std::mt19937 rng(20250901);
  std::uniform_int_distribution<size_t> where(0, cubin.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int round = 0; round < 3000; ++round) {
    std::string corrupted = cubin;
    for (int k = 0; k < 8; ++k) {
      corrupted[where(rng)] = static_cast<char>(byte(rng));
    }
    absl::StatusOr<v1::CubinInfo> info = InspectCubin(corrupted);
    ASSERT_TRUE(IsOkOrInvalidArgument(info.status())) << "round " << round << ": " << info.status();
  }
}

TEST(CubinTest, RejectsBrokenAttributeRecords) {
  const std::string cubin = Compile(kKernels, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  const std::optional<RawSection> kernel_info = FindRawSection(cubin, ".nv.info.k_param");
  ASSERT_TRUE(kernel_info.has_value());
  const std::optional<size_t> cbank = FindRecord(cubin, *kernel_info, 0x0a);
  ASSERT_TRUE(cbank.has_value());

  {  // An SVAL payload running past the section's end.
    std::string corrupted = cubin;
    const uint16_t huge = 0xfff0;
    std::memcpy(corrupted.data() + *cbank + 2, &huge, sizeof(huge));
    EXPECT_EQ(InspectCubin(corrupted).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // An unknown record format.
    std::string corrupted = cubin;
    corrupted[*cbank] = 0x09;
    EXPECT_EQ(InspectCubin(corrupted).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // PARAM_CBANK with a payload too short for its fields.
    std::string corrupted = cubin;
    const uint16_t four = 4;
    std::memcpy(corrupted.data() + *cbank + 2, &four, sizeof(four));
    EXPECT_EQ(InspectCubin(corrupted).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // The global .nv.info cut mid-record.
    const std::optional<RawSection> global = FindRawSection(cubin, ".nv.info");
    ASSERT_TRUE(global.has_value());
    std::string corrupted = cubin;
    const uint64_t size = global->size - 2;
    std::memcpy(corrupted.data() + global->header_offset + 0x20, &size, sizeof(size));
    EXPECT_EQ(InspectCubin(corrupted).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CubinTest, RejectsOtherElfVersion) {
  std::string cubin = Compile(kTrivialKernel, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  cubin[6] = 2;  // EI_VERSION
  absl::StatusOr<v1::CubinInfo> info = InspectCubin(cubin);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("not a CUDA ELF"), std::string::npos) << info.status();
}

TEST(CubinTest, RejectsCompressedSections) {
  // ptxas never compresses; a compressed string table must not be inflated.
  const std::string cubin = Compile(kKernels, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  for (const char* name : {".shstrtab", ".strtab", ".symtab", ".nv.info", ".nv.info.k_param"}) {
    SCOPED_TRACE(name);
    const std::optional<RawSection> section = FindRawSection(cubin, name);
    ASSERT_TRUE(section.has_value());
    std::string corrupted = cubin;
    const uint64_t flags = Load<uint64_t>(corrupted, section->header_offset + 0x08) | 0x800;
    std::memcpy(corrupted.data() + section->header_offset + 0x08, &flags, sizeof(flags));
    absl::StatusOr<v1::CubinInfo> info = InspectCubin(corrupted);
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(info.status().message().find("compressed"), std::string::npos) << info.status();
  }
}

TEST(CubinTest, EdgeValuesInHeaderFieldsNeverCrash) {
  // Every ELF and section header field the inspector or libelf reads, set in
  // turn to values at the edges of its range: e_shnum 0 (count taken from
  // section 0), e_shstrndx SHN_XINDEX, offsets and sizes at or past the end
  // of the file, links to sections that do not exist.
  const std::string cubin = Compile(kKernels, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  const auto shoff = Load<uint64_t>(cubin, 0x28);
  const auto shnum = Load<uint16_t>(cubin, 0x3c);
  struct Field {
    size_t offset;
    size_t width;
  };
  std::vector<Field> fields = {{0x28, 8}, {0x3a, 2}, {0x3c, 2}, {0x3e, 2}};
  for (size_t i = 0; i < shnum; ++i) {
    const size_t header = shoff + i * 64;
    // sh_name, sh_type, sh_flags, sh_offset, sh_size, sh_link, sh_info,
    // sh_entsize
    for (const Field& field : std::vector<Field>{{0x00, 4},
                                                 {0x04, 4},
                                                 {0x08, 8},
                                                 {0x18, 8},
                                                 {0x20, 8},
                                                 {0x28, 4},
                                                 {0x2c, 4},
                                                 {0x38, 8}}) {
      fields.push_back({header + field.offset, field.width});
    }
  }
  const uint64_t values[] = {0,
                             1,
                             2,
                             8,
                             0xff,
                             0xffff,
                             0x7fffffff,
                             0xffffffff,
                             ~uint64_t{0},
                             cubin.size() - 1,
                             cubin.size(),
                             shoff,
                             shnum};
  for (const Field& field : fields) {
    for (const uint64_t value : values) {
      std::string corrupted = cubin;
      std::memcpy(corrupted.data() + field.offset, &value, field.width);
      absl::StatusOr<v1::CubinInfo> info = InspectCubin(corrupted);
      ASSERT_TRUE(IsOkOrInvalidArgument(info.status()))
          << "field at " << field.offset << " = " << value << ": " << info.status();
    }
  }
}

TEST(CubinTest, InspectsConcurrently) {
  // libelf is set up once, on whichever thread comes first; after that each
  // call has its own handle.
  const std::string cubin = Compile(kKernels, "sm_90a").cubin;
  ASSERT_FALSE(cubin.empty());
  absl::StatusOr<v1::CubinInfo> want = InspectCubin(cubin);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<v1::CubinInfo> info = InspectCubin(cubin);
        results[t] = info.ok() ? info->SerializeAsString() : "error";
        if (!info.ok()) return;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& result : results) {
    EXPECT_EQ(result, want->SerializeAsString());
  }
}

}  // namespace
}  // namespace kforge
