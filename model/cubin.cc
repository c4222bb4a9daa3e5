#include "model/cubin.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kforge/v1/artifact.pb.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/BinaryFormat/ELF.h"
#include "llvm/Object/ELF.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/Error.h"

// Layout notes, all measured on cubins that NVRTC 13.0 (ptxas 13.0.88) wrote
// for sm_75 ... sm_121a and cross-checked against `--ptxas-options=-v` and,
// for sm_90/sm_90a, against cuFuncGetAttribute on an H200 (driver 580):
//
// e_flags. EI_ABIVERSION 8 (CUDA 13) keeps the SM number in bits 8..15; the
// low byte is 0x04 up to sm_90 and 0x02 from sm_100 on, bits 24..31 are 0x06,
// and the virtual-SM field (bits 16..23) is 0. LLVM names bit 3
// (EF_CUDA_ACCELERATORS) the "a" flag for this ABI, but ptxas 13.0 never sets
// it: sm_90 and sm_90a, sm_100/sm_100a/sm_100f, sm_120/sm_120a/sm_120f have
// identical e_flags. The "a" marker is attribute 0x09 of the .nv.compat
// section instead (1 for sm_90a, sm_100a, sm_103a, sm_110a, sm_120a, sm_121a;
// 0 otherwise). "f" targets produce the same cubin as the base target except
// for the ptxas command line in .note.nv.tkinfo, so they read as the base.
// Older ABIs (EI_ABIVERSION 7, CUDA <= 12) keep the SM number in the low byte
// with EF_CUDA_ACCELERATORS_V1 (0x800) for "a" (LLVM BinaryFormat/ELF.h).
//
// Registers. ptxas records them per function in the global .nv.info
// (EIATTR_REGCOUNT); only up to sm_89 are they also in the .text.<name>
// section header's sh_info >> 24 (sh_info holds just the symbol index from
// sm_90 on).
//
// Static shared memory. From sm_90 on, .nv.shared.<name> also covers the
// 1 KiB the driver reserves at the start of each block's shared window
// (the cubin then carries .nv.shared.reserved.0 and the
// .nv.reservedSmem.offset0 symbol): 4000 bytes of __shared__ give a 5024-byte
// section, while ptxas -v and CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES say 4000.
// Up to sm_89 the section size is the static size.

namespace kforge {
namespace {

using Elf = llvm::object::ELF64LEFile;
using Shdr = Elf::Elf_Shdr;
using Sym = Elf::Elf_Sym;
using llvm::ArrayRef;
using llvm::StringRef;

// .nv.info / .nv.compat record formats (EIFMT_*). Every record starts with
// {uint8 format, uint8 attribute, uint16 field}; for SVAL the field is the
// byte size of the payload that follows, for HVAL it is the value, for BVAL
// its low byte is the value, for NVAL it is zero padding.
constexpr uint8_t kFmtNval = 0x01;
constexpr uint8_t kFmtBval = 0x02;
constexpr uint8_t kFmtHval = 0x03;
constexpr uint8_t kFmtSval = 0x04;
constexpr size_t kRecordHeaderBytes = 4;

// Attribute ids (EIATTR_*, as cuobjdump -elf names them).
// {uint32 x, uint32 y, uint32 z} from __launch_bounds__ (.maxntid).
constexpr uint8_t kAttrMaxThreads = 0x05;
// {uint32 constant-bank symbol index, uint16 offset, uint16 size}.
constexpr uint8_t kAttrParamCbank = 0x0a;
// {uint32 function symbol index, uint32 bytes}, global .nv.info.
constexpr uint8_t kAttrFrameSize = 0x11;
constexpr uint8_t kAttrMinStackSize = 0x12;
// {uint32 index, uint16 ordinal, uint16 offset, uint32 flags}; the
// parameter's size in bytes is flags >> 18.
constexpr uint8_t kAttrKparamInfo = 0x17;
// HVAL: the parameter block size again.
constexpr uint8_t kAttrCbankParamSize = 0x19;
// {uint32 function symbol index, uint32 registers}, global .nv.info.
constexpr uint8_t kAttrRegcount = 0x2f;
// .nv.compat, BVAL: 1 when compiled for an arch-specific ("a") target.
constexpr uint8_t kCompatAttrArchSpecific = 0x09;

// st_other bit ptxas sets on kernel entry symbols (STO_CUDA_ENTRY); device
// functions are local with st_other 0.
constexpr uint8_t kStoCudaEntry = 0x10;

// ELF ABI version from which the SM number moved to bits 8..15.
constexpr uint8_t kCudaAbiV2 = 8;
constexpr uint32_t kFlagsV1SmMask = 0xff;
constexpr uint32_t kFlagsV1Accelerators = 0x800;
constexpr uint32_t kFlagsV2SmShift = 8;
constexpr uint32_t kFlagsV2SmMask = 0xff;
constexpr uint32_t kFlagsV2Accelerators = 0x8;

// Shared memory the driver reserves per block on sm_80+
// (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: 1024 on an H200),
// which sm_90+ cubins include in .nv.shared.<name>.
constexpr uint64_t kReservedSmemBytes = 1024;

absl::Status NotCudaElf(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("not a CUDA ELF: ", why));
}

absl::Status Malformed(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed cubin: ", why));
}

template <typename T>
absl::StatusOr<T> Take(llvm::Expected<T> value, const std::string& what) {
  if (!value) {
    return Malformed(
        absl::StrCat(what, ": ", llvm::toString(value.takeError())));
  }
  return std::move(*value);
}

struct Record {
  uint8_t format = 0;
  uint8_t attribute = 0;
  uint16_t field = 0;         // value for HVAL/BVAL, size for SVAL
  ArrayRef<uint8_t> payload;  // SVAL only
};

// Splits an attribute section into records, checking every length against
// the section's end.
absl::StatusOr<std::vector<Record>> ParseRecords(ArrayRef<uint8_t> data,
                                                 const std::string& section) {
  std::vector<Record> records;
  size_t offset = 0;
  while (offset < data.size()) {
    if (data.size() - offset < kRecordHeaderBytes) {
      return Malformed(absl::StrFormat("%s: truncated record at offset %d",
                                       section, offset));
    }
    Record record;
    record.format = data[offset];
    record.attribute = data[offset + 1];
    record.field = llvm::support::endian::read16le(data.data() + offset + 2);
    offset += kRecordHeaderBytes;
    switch (record.format) {
      case kFmtNval:
      case kFmtBval:
      case kFmtHval:
        break;
      case kFmtSval:
        if (data.size() - offset < record.field) {
          return Malformed(absl::StrFormat(
              "%s: attribute 0x%02x claims %d bytes, %d left", section,
              record.attribute, record.field, data.size() - offset));
        }
        record.payload = data.slice(offset, record.field);
        offset += record.field;
        break;
      default:
        return Malformed(absl::StrFormat(
            "%s: unknown record format 0x%02x at offset %d", section,
            record.format, offset - kRecordHeaderBytes));
    }
    records.push_back(record);
  }
  return records;
}

uint32_t PayloadWord(const Record& record, size_t index) {
  return llvm::support::endian::read32le(record.payload.data() + 4 * index);
}

absl::Status NeedPayload(const Record& record, size_t bytes,
                         const std::string& section) {
  if (record.format != kFmtSval || record.payload.size() < bytes) {
    return Malformed(absl::StrFormat(
        "%s: attribute 0x%02x has format 0x%02x and %d payload bytes, want "
        "SVAL with at least %d",
        section, record.attribute, record.format, record.payload.size(),
        bytes));
  }
  return absl::OkStatus();
}

// Per-function values from the global .nv.info, keyed by symbol index.
struct FunctionInfo {
  std::map<uint32_t, uint32_t> registers;
  std::map<uint32_t, uint32_t> frame_bytes;
  std::map<uint32_t, uint32_t> min_stack_bytes;
};

absl::StatusOr<FunctionInfo> ReadGlobalInfo(ArrayRef<uint8_t> data) {
  const std::string section = ".nv.info";
  absl::StatusOr<std::vector<Record>> records = ParseRecords(data, section);
  if (!records.ok()) return records.status();
  FunctionInfo info;
  for (const Record& record : *records) {
    std::map<uint32_t, uint32_t>* target = nullptr;
    switch (record.attribute) {
      case kAttrRegcount:
        target = &info.registers;
        break;
      case kAttrFrameSize:
        target = &info.frame_bytes;
        break;
      case kAttrMinStackSize:
        target = &info.min_stack_bytes;
        break;
      default:
        continue;
    }
    if (absl::Status s = NeedPayload(record, 8, section); !s.ok()) return s;
    (*target)[PayloadWord(record, 0)] = PayloadWord(record, 1);
  }
  return info;
}

// Fills param_bytes and max_threads from .nv.info.<kernel>.
absl::Status ReadKernelInfo(ArrayRef<uint8_t> data, const std::string& section,
                            v1::KernelResources& kernel) {
  absl::StatusOr<std::vector<Record>> records = ParseRecords(data, section);
  if (!records.ok()) return records.status();
  bool have_cbank = false;
  uint32_t cbank_size = 0;
  bool have_cbank_param_size = false;
  uint32_t cbank_param_size = 0;
  uint64_t kparam_end = 0;
  for (const Record& record : *records) {
    switch (record.attribute) {
      case kAttrParamCbank: {
        if (absl::Status s = NeedPayload(record, 8, section); !s.ok()) return s;
        have_cbank = true;
        cbank_size = llvm::support::endian::read16le(record.payload.data() + 6);
        break;
      }
      case kAttrCbankParamSize:
        if (record.format != kFmtHval) {
          return Malformed(absl::StrFormat(
              "%s: attribute 0x%02x has format 0x%02x, want HVAL", section,
              record.attribute, record.format));
        }
        have_cbank_param_size = true;
        cbank_param_size = record.field;
        break;
      case kAttrKparamInfo: {
        if (absl::Status s = NeedPayload(record, 12, section); !s.ok()) {
          return s;
        }
        const uint64_t offset =
            llvm::support::endian::read16le(record.payload.data() + 6);
        const uint64_t size = PayloadWord(record, 2) >> 18;
        kparam_end = std::max(kparam_end, offset + size);
        break;
      }
      case kAttrMaxThreads: {
        if (absl::Status s = NeedPayload(record, 12, section); !s.ok()) {
          return s;
        }
        const uint64_t threads = uint64_t{PayloadWord(record, 0)} *
                                 PayloadWord(record, 1) *
                                 PayloadWord(record, 2);
        if (threads > std::numeric_limits<uint32_t>::max()) {
          return Malformed(
              absl::StrFormat("%s: max threads %d overflow", section, threads));
        }
        kernel.set_max_threads(static_cast<uint32_t>(threads));
        break;
      }
      default:
        break;
    }
  }
  // PARAM_CBANK is what the driver sizes the launch's parameter copy by;
  // the other two describe the same block and are fallbacks.
  if (have_cbank) {
    kernel.set_param_bytes(cbank_size);
  } else if (have_cbank_param_size) {
    kernel.set_param_bytes(cbank_param_size);
  } else {
    kernel.set_param_bytes(static_cast<uint32_t>(kparam_end));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadArch(const Elf& elf, const Shdr* compat) {
  const auto& header = elf.getHeader();
  const uint8_t abi = header.e_ident[llvm::ELF::EI_ABIVERSION];
  const uint32_t flags = header.e_flags;
  uint32_t sm = 0;
  bool arch_specific = false;
  if (abi >= kCudaAbiV2) {
    sm = (flags >> kFlagsV2SmShift) & kFlagsV2SmMask;
    arch_specific = (flags & kFlagsV2Accelerators) != 0;
  } else {
    sm = flags & kFlagsV1SmMask;
    arch_specific = (flags & kFlagsV1Accelerators) != 0;
  }
  if (sm == 0) {
    return Malformed(absl::StrFormat(
        "no SM number in e_flags 0x%08x (EI_ABIVERSION %d)", flags, abi));
  }
  if (compat != nullptr) {
    absl::StatusOr<ArrayRef<uint8_t>> data =
        Take(elf.getSectionContents(*compat), ".nv.compat");
    if (!data.ok()) return data.status();
    absl::StatusOr<std::vector<Record>> records =
        ParseRecords(*data, ".nv.compat");
    if (!records.ok()) return records.status();
    for (const Record& record : *records) {
      if (record.attribute == kCompatAttrArchSpecific &&
          record.format == kFmtBval && (record.field & 0xff) != 0) {
        arch_specific = true;
      }
    }
  }
  return absl::StrCat("sm_", sm, arch_specific ? "a" : "");
}

absl::StatusOr<ArrayRef<uint8_t>> SectionBytes(const Elf& elf,
                                               const Shdr& section,
                                               const std::string& name) {
  if (section.sh_type == llvm::ELF::SHT_NOBITS) {
    return Malformed(absl::StrCat(name, " has no contents (SHT_NOBITS)"));
  }
  return Take(elf.getSectionContents(section), name);
}

}  // namespace

absl::StatusOr<v1::CubinInfo> InspectCubin(std::string_view bytes) {
  if (bytes.size() < llvm::ELF::EI_NIDENT ||
      std::memcmp(bytes.data(), llvm::ELF::ElfMagic, 4) != 0) {
    return NotCudaElf("no ELF magic");
  }
  if (bytes.size() < sizeof(Elf::Elf_Ehdr)) {
    return NotCudaElf(absl::StrFormat("%d bytes, shorter than an ELF64 header",
                                      bytes.size()));
  }
  if (bytes[llvm::ELF::EI_CLASS] != llvm::ELF::ELFCLASS64) {
    return NotCudaElf(absl::StrFormat("ELF class %d, want ELFCLASS64",
                                      bytes[llvm::ELF::EI_CLASS]));
  }
  if (bytes[llvm::ELF::EI_DATA] != llvm::ELF::ELFDATA2LSB) {
    return NotCudaElf(absl::StrFormat(
        "ELF data encoding %d, want little-endian", bytes[llvm::ELF::EI_DATA]));
  }
  absl::StatusOr<Elf> elf_or =
      Take(Elf::create(StringRef(bytes.data(), bytes.size())), "ELF header");
  if (!elf_or.ok()) return NotCudaElf(std::string(elf_or.status().message()));
  const Elf& elf = *elf_or;
  const auto& header = elf.getHeader();
  if (header.e_machine != llvm::ELF::EM_CUDA) {
    return NotCudaElf(absl::StrFormat("e_machine %d, want EM_CUDA (%d)",
                                      uint16_t{header.e_machine},
                                      llvm::ELF::EM_CUDA));
  }

  absl::StatusOr<ArrayRef<Shdr>> sections =
      Take(elf.sections(), "section headers");
  if (!sections.ok()) return sections.status();
  absl::StatusOr<StringRef> shstrtab =
      Take(elf.getSectionStringTable(*sections), "section name table");
  if (!shstrtab.ok()) return shstrtab.status();

  std::vector<StringRef> section_names(sections->size());
  std::map<StringRef, const Shdr*> by_name;
  const Shdr* symtab = nullptr;
  for (size_t i = 0; i < sections->size(); ++i) {
    const Shdr& section = (*sections)[i];
    absl::StatusOr<StringRef> name =
        Take(elf.getSectionName(section, *shstrtab),
             absl::StrCat("name of section ", i));
    if (!name.ok()) return name.status();
    section_names[i] = *name;
    by_name.emplace(*name, &section);
    if (section.sh_type == llvm::ELF::SHT_SYMTAB && symtab == nullptr) {
      symtab = &section;
    }
  }
  auto find_section = [&](const std::string& name) -> const Shdr* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  if (symtab == nullptr) return Malformed("no symbol table");

  v1::CubinInfo info;
  info.set_elf_abi_version(header.e_ident[llvm::ELF::EI_ABIVERSION]);
  absl::StatusOr<std::string> arch = ReadArch(elf, find_section(".nv.compat"));
  if (!arch.ok()) return arch.status();
  info.set_arch(*arch);

  absl::StatusOr<ArrayRef<Sym>> symbols =
      Take(elf.symbols(symtab), "symbol table");
  if (!symbols.ok()) return symbols.status();
  absl::StatusOr<StringRef> strtab =
      Take(elf.getStringTableForSymtab(*symtab, *sections), "symbol names");
  if (!strtab.ok()) return strtab.status();

  FunctionInfo functions;
  if (const Shdr* global = find_section(".nv.info"); global != nullptr) {
    absl::StatusOr<ArrayRef<uint8_t>> data =
        SectionBytes(elf, *global, ".nv.info");
    if (!data.ok()) return data.status();
    absl::StatusOr<FunctionInfo> read = ReadGlobalInfo(*data);
    if (!read.ok()) return read.status();
    functions = *std::move(read);
  }

  bool reserved_smem_in_sections =
      find_section(".nv.shared.reserved.0") != nullptr;
  std::vector<StringRef> symbol_names(symbols->size());
  for (size_t i = 0; i < symbols->size(); ++i) {
    absl::StatusOr<StringRef> name =
        Take((*symbols)[i].getName(*strtab), absl::StrCat("symbol ", i));
    if (!name.ok()) return name.status();
    symbol_names[i] = *name;
    if (*name == ".nv.reservedSmem.offset0") reserved_smem_in_sections = true;
  }

  for (size_t i = 0; i < symbols->size(); ++i) {
    const Sym& symbol = (*symbols)[i];
    if (symbol.getType() != llvm::ELF::STT_FUNC) continue;
    const uint32_t shndx = symbol.st_shndx;
    if (shndx == llvm::ELF::SHN_UNDEF || shndx >= llvm::ELF::SHN_LORESERVE ||
        shndx >= sections->size()) {
      continue;
    }
    const std::string name = symbol_names[i].str();
    if (section_names[shndx] != ".text." + name) continue;
    const std::string info_name = ".nv.info." + name;
    const Shdr* kernel_info = find_section(info_name);
    if ((symbol.st_other & kStoCudaEntry) == 0 && kernel_info == nullptr) {
      continue;  // a device function
    }

    v1::KernelResources& kernel = *info.add_kernels();
    kernel.set_name(name);
    const uint32_t symbol_index = static_cast<uint32_t>(i);
    if (auto it = functions.registers.find(symbol_index);
        it != functions.registers.end()) {
      kernel.set_registers(it->second);
    } else {
      kernel.set_registers((*sections)[shndx].sh_info >> 24);
    }
    uint32_t local = 0;
    if (auto it = functions.frame_bytes.find(symbol_index);
        it != functions.frame_bytes.end()) {
      local = it->second;
    }
    // The cumulative stack adds callees' frames: what a launch must
    // provide per thread.
    if (auto it = functions.min_stack_bytes.find(symbol_index);
        it != functions.min_stack_bytes.end()) {
      local = std::max(local, it->second);
    }
    kernel.set_local_bytes(local);

    if (const Shdr* shared = find_section(".nv.shared." + name);
        shared != nullptr) {
      uint64_t smem = shared->sh_size;
      if (reserved_smem_in_sections) {
        smem = smem > kReservedSmemBytes ? smem - kReservedSmemBytes : 0;
      }
      if (smem > std::numeric_limits<uint32_t>::max()) {
        return Malformed(
            absl::StrFormat(".nv.shared.%s: size %d too large", name, smem));
      }
      kernel.set_static_smem_bytes(static_cast<uint32_t>(smem));
    }

    if (kernel_info != nullptr) {
      absl::StatusOr<ArrayRef<uint8_t>> data =
          SectionBytes(elf, *kernel_info, info_name);
      if (!data.ok()) return data.status();
      if (absl::Status s = ReadKernelInfo(*data, info_name, kernel); !s.ok()) {
        return s;
      }
    }
  }

  std::stable_sort(
      info.mutable_kernels()->begin(), info.mutable_kernels()->end(),
      [](const v1::KernelResources& a, const v1::KernelResources& b) {
        return a.name() < b.name();
      });
  return info;
}

}  // namespace kforge
