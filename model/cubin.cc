#include "model/cubin.h"

#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kforge/v1/artifact.pb.h"

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

using Bytes = std::span<const uint8_t>;

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

// libelf's reason for its last failure on this thread (its error state is
// thread-local).
std::string LibelfError() {
  const char* message = elf_errmsg(-1);
  return message != nullptr ? message : "unknown libelf error";
}

// ELF fields are little-endian (checked before anything is read), whatever
// the host.
uint16_t Read16Le(const uint8_t* p) {
  return static_cast<uint16_t>(uint16_t{p[0]} | uint16_t{p[1]} << 8);
}

uint32_t Read32Le(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

struct Record {
  uint8_t format = 0;
  uint8_t attribute = 0;
  uint16_t field = 0;  // value for HVAL/BVAL, size for SVAL
  Bytes payload;       // SVAL only
};

// Splits an attribute section into records, checking every length against
// the section's end.
absl::StatusOr<std::vector<Record>> ParseRecords(Bytes data, const std::string& section) {
  std::vector<Record> records;
  size_t offset = 0;
  while (offset < data.size()) {
    if (data.size() - offset < kRecordHeaderBytes) {
      return Malformed(absl::StrFormat("%s: truncated record at offset %d", section, offset));
    }
    Record record;
    record.format = data[offset];
    record.attribute = data[offset + 1];
    record.field = Read16Le(data.data() + offset + 2);
    offset += kRecordHeaderBytes;
    switch (record.format) {
      case kFmtNval:
      case kFmtBval:
      case kFmtHval:
        break;
      case kFmtSval:
        if (data.size() - offset < record.field) {
          return Malformed(absl::StrFormat("%s: attribute 0x%02x claims %d bytes, %d left", section,
                                           record.attribute, record.field, data.size() - offset));
        }
        record.payload = data.subspan(offset, record.field);
        offset += record.field;
        break;
      default:
        return Malformed(absl::StrFormat("%s: unknown record format 0x%02x at offset %d", section,
                                         record.format, offset - kRecordHeaderBytes));
    }
    records.push_back(record);
  }
  return records;
}

uint32_t PayloadWord(const Record& record, size_t index) {
  return Read32Le(record.payload.data() + 4 * index);
}
absl::Status NeedPayload(const Record& record, size_t bytes, const std::string& section) {
  if (record.format != kFmtSval || record.payload.size() < bytes) {
    return Malformed(
        absl::StrFormat("%s: attribute 0x%02x has format 0x%02x and %d payload bytes, want "
                        "SVAL with at least %d",
                        section, record.attribute, record.format, record.payload.size(), bytes));
  }
  return absl::OkStatus();
}

// Per-function values from the global .nv.info, keyed by symbol index.
struct FunctionInfo {
  std::map<uint32_t, uint32_t> registers;
  std::map<uint32_t, uint32_t> frame_bytes;
  std::map<uint32_t, uint32_t> min_stack_bytes;
};

absl::StatusOr<FunctionInfo> ReadGlobalInfo(Bytes data) {
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
absl::Status ReadKernelInfo(Bytes data, const std::string& section, v1::KernelResources& kernel) {
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
        cbank_size = Read16Le(record.payload.data() + 6);
        break;
      }
      case kAttrCbankParamSize:
        if (record.format != kFmtHval) {
          return Malformed(absl::StrFormat("%s: attribute 0x%02x has format 0x%02x, want HVAL",
                                           section, record.attribute, record.format));
        }
        have_cbank_param_size = true;
        cbank_param_size = record.field;
        break;
      case kAttrKparamInfo: {
        if (absl::Status s = NeedPayload(record, 12, section); !s.ok()) {
          return s;
        }
        const uint64_t offset = Read16Le(record.payload.data() + 6);
        const uint64_t size = PayloadWord(record, 2) >> 18;
        kparam_end = std::max(kparam_end, offset + size);
        break;
      }
      case kAttrMaxThreads: {
        if (absl::Status s = NeedPayload(record, 12, section); !s.ok()) {
          return s;
        }
        const uint64_t threads =
            uint64_t{PayloadWord(record, 0)} * PayloadWord(record, 1) * PayloadWord(record, 2);
        if (threads > std::numeric_limits<uint32_t>::max()) {
          return Malformed(absl::StrFormat("%s: max threads %d overflow", section, threads));
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

// The SM arch from e_flags, with the "a" marker of .nv.compat (its contents,
// when the cubin has that section).
absl::StatusOr<std::string> ReadArch(const Elf64_Ehdr& header, std::optional<Bytes> compat) {
  const uint8_t abi = header.e_ident[EI_ABIVERSION];
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
    return Malformed(
        absl::StrFormat("no SM number in e_flags 0x%08x (EI_ABIVERSION %d)", flags, abi));
  }
  if (compat.has_value()) {
    absl::StatusOr<std::vector<Record>> records = ParseRecords(*compat, ".nv.compat");
    if (!records.ok()) return records.status();
    for (const Record& record : *records) {
      if (record.attribute == kCompatAttrArchSpecific && record.format == kFmtBval &&
          (record.field & 0xff) != 0) {
        arch_specific = true;
      }
    }
  }
  return absl::StrCat("sm_", sm, arch_specific ? "a" : "");
}

// elf_version must come before any other libelf call and sets process-wide
// state, so it runs once, on whichever thread inspects the first cubin.
bool LibelfReady() {
  static std::once_flag once;
  static bool ready = false;
  std::call_once(once, [] { ready = elf_version(EV_CURRENT) != EV_NONE; });
  return ready;
}

// Checks the section header table before libelf sees the image, so that
// what is safe to read does not depend on the libelf version: whole
// Elf64_Shdr entries, aligned, all inside the file. Returns the number of
// sections: e_shnum, or section 0's sh_size when e_shnum is 0 (the ELF escape
// for SHN_LORESERVE or more).
absl::StatusOr<uint64_t> CheckSectionTable(std::string_view bytes, const Elf64_Ehdr& header) {
  const uint64_t offset = header.e_shoff;
  if (offset == 0) return Malformed("no section header table (e_shoff 0)");
  if (header.e_shentsize != sizeof(Elf64_Shdr)) {
    return Malformed(absl::StrFormat("section headers: e_shentsize %d, want %d", header.e_shentsize,
                                     sizeof(Elf64_Shdr)));
  }
  if (offset > bytes.size() || bytes.size() - offset < sizeof(Elf64_Shdr)) {
    return Malformed(
        absl::StrFormat("section headers: e_shoff 0x%x is past the end of "
                        "the %d-byte file",
                        offset, bytes.size()));
  }
  if (offset % alignof(Elf64_Shdr) != 0) {
    return Malformed(absl::StrFormat("section headers: e_shoff 0x%x is not %d-byte aligned", offset,
                                     alignof(Elf64_Shdr)));
  }
  uint64_t count = header.e_shnum;
  if (count == 0) {
    Elf64_Shdr first;
    std::memcpy(&first, bytes.data() + offset, sizeof(first));
    count = first.sh_size;
  }
  if (count > (bytes.size() - offset) / sizeof(Elf64_Shdr)) {
    return Malformed(
        absl::StrFormat("section headers: %d entries at 0x%x run past the end of the %d-byte "
                        "file",
                        count, offset, bytes.size()));
  }
  return count;
}

struct ElfEnd {
  void operator()(Elf* elf) const { elf_end(elf); }
};

// A libelf handle over a private copy of a cubin. elf_memory takes a
// writable image and reads it in place for as long as the handle lives, so
// the caller's bytes are copied (a cubin is a few MB at most) rather than
// cast to non-const. Members are destroyed in reverse order: elf_end runs
// before the copy is freed. Moving keeps the vector's buffer, so a moved
// handle still points at live memory.
class CubinImage {
 public:
  static absl::StatusOr<CubinImage> Open(std::string_view bytes) {
    if (!LibelfReady()) {
      return absl::InternalError(
          absl::StrCat("libelf does not support EV_CURRENT: ", LibelfError()));
    }
    CubinImage image;
    image.bytes_.assign(bytes.begin(), bytes.end());
    image.elf_.reset(elf_memory(image.bytes_.data(), image.bytes_.size()));
    if (image.elf_ == nullptr) {
      return Malformed(absl::StrCat("libelf: ", LibelfError()));
    }
    if (elf_kind(image.elf_.get()) != ELF_K_ELF) {
      return NotCudaElf("libelf does not read it as an ELF object");
    }
    return image;
  }

  Elf* elf() const { return elf_.get(); }
  size_t size() const { return bytes_.size(); }

 private:
  CubinImage() = default;

  std::vector<char> bytes_;
  std::unique_ptr<Elf, ElfEnd> elf_;
};

struct Section {
  size_t index = 0;
  GElf_Shdr header{};
  std::string_view name;  // points into the image
};

// A section's data as libelf hands it out, after checking that the section
// lies inside the file (libelf checks this too; checking here does not
// depend on its version). Null for an empty section.
absl::StatusOr<Elf_Data*> SectionData(const CubinImage& image, const Section& section,
                                      const std::string& name) {
  const GElf_Shdr& header = section.header;
  if (header.sh_type == SHT_NOBITS) {
    return Malformed(absl::StrCat(name, " has no contents (SHT_NOBITS)"));
  }
  // ptxas never compresses a section. libelf would hand out the compressed
  // bytes (elf_getdata) or inflate them into a buffer sized by the file
  // (elf_strptr).
  if ((header.sh_flags & SHF_COMPRESSED) != 0) {
    return Malformed(absl::StrCat(name, " is compressed (SHF_COMPRESSED)"));
  }
  if (header.sh_offset > image.size() || header.sh_size > image.size() - header.sh_offset) {
    return Malformed(
        absl::StrFormat("%s: sh_offset 0x%x + sh_size 0x%x runs past the end of the %d-byte "
                        "file",
                        name, header.sh_offset, header.sh_size, image.size()));
  }
  if (header.sh_size == 0) return nullptr;
  Elf_Scn* scn = elf_getscn(image.elf(), section.index);
  Elf_Data* data = scn == nullptr ? nullptr : elf_getdata(scn, nullptr);
  if (data == nullptr) {  // e.g. sh_size does not fit the sh_type's entries
    return Malformed(absl::StrFormat("%s (sh_type 0x%x): %s", name, header.sh_type, LibelfError()));
  }
  if (data->d_buf == nullptr || data->d_size != header.sh_size) {
    return Malformed(absl::StrFormat("%s: libelf gives %d bytes, sh_size is %d", name, data->d_size,
                                     header.sh_size));
  }
  return data;
}

absl::StatusOr<Bytes> SectionBytes(const CubinImage& image, const Section& section,
                                   const std::string& name) {
  absl::StatusOr<Elf_Data*> data = SectionData(image, section, name);
  if (!data.ok()) return data.status();
  if (*data == nullptr) return Bytes();
  return Bytes(static_cast<const uint8_t*>((*data)->d_buf), (*data)->d_size);
}

// A string table that elf_strptr may then read: an existing SHT_STRTAB
// section inside the file, not empty and NUL-terminated, so every string
// taken from it ends inside it.
absl::Status CheckStringTable(const CubinImage& image, const std::vector<Section>& sections,
                              size_t index, const std::string& what) {
  if (index >= sections.size()) {
    return Malformed(absl::StrFormat("%s: section %d does not exist (%d sections)", what, index,
                                     sections.size()));
  }
  const Section& section = sections[index];
  if (section.header.sh_type != SHT_STRTAB) {
    return Malformed(absl::StrFormat("%s: section %d has sh_type %d, want SHT_STRTAB", what, index,
                                     section.header.sh_type));
  }
  absl::StatusOr<Bytes> data = SectionBytes(image, section, what);
  if (!data.ok()) return data.status();
  if (data->empty() || data->back() != 0) {
    return Malformed(absl::StrCat(what, ": empty or not NUL-terminated"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::CubinInfo> InspectCubin(std::string_view bytes) {
  if (bytes.size() < EI_NIDENT || std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0) {
    return NotCudaElf("no ELF magic");
  }
  if (bytes.size() < sizeof(Elf64_Ehdr)) {
    return NotCudaElf(absl::StrFormat("%d bytes, shorter than an ELF64 header", bytes.size()));
  }
  // Read here rather than through gelf_getehdr: the section table checks
  // below must run before libelf parses the image.
  Elf64_Ehdr header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  const unsigned char* ident = header.e_ident;
  if (ident[EI_CLASS] != ELFCLASS64) {
    return NotCudaElf(absl::StrFormat("ELF class %d, want ELFCLASS64", ident[EI_CLASS]));
  }
  if (ident[EI_DATA] != ELFDATA2LSB) {
    return NotCudaElf(absl::StrFormat("ELF data encoding %d, want little-endian", ident[EI_DATA]));
  }
  // libelf reads only this version (any other is ELF_K_NONE to it); say so
  // by name.
  if (ident[EI_VERSION] != EV_CURRENT) {
    return NotCudaElf(
        absl::StrFormat("EI_VERSION %d, want EV_CURRENT (%d)", ident[EI_VERSION], EV_CURRENT));
  }
  if (header.e_machine != EM_CUDA) {
    return NotCudaElf(
        absl::StrFormat("e_machine %d, want EM_CUDA (%d)", header.e_machine, EM_CUDA));
  }
  absl::StatusOr<uint64_t> section_count = CheckSectionTable(bytes, header);
  if (!section_count.ok()) return section_count.status();

  absl::StatusOr<CubinImage> image_or = CubinImage::Open(bytes);
  if (!image_or.ok()) return image_or.status();
  const CubinImage& image = *image_or;
  Elf* elf = image.elf();
  size_t libelf_count = 0;
  if (elf_getshdrnum(elf, &libelf_count) != 0) {
    return Malformed(absl::StrCat("section count: ", LibelfError()));
  }
  if (libelf_count != *section_count) {
    return Malformed(
        absl::StrFormat("libelf counts %d sections, the header %d", libelf_count, *section_count));
  }

  std::vector<Section> sections(libelf_count);
  for (size_t i = 0; i < sections.size(); ++i) {
    sections[i].index = i;
    Elf_Scn* scn = elf_getscn(elf, i);
    if (scn == nullptr || gelf_getshdr(scn, &sections[i].header) == nullptr) {
      return Malformed(absl::StrCat("section header ", i, ": ", LibelfError()));
    }
  }
  size_t shstrndx = 0;  // SHN_XINDEX already resolved through section 0
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) {
    return Malformed(absl::StrCat("section name table: ", LibelfError()));
  }
  if (!sections.empty() && shstrndx != SHN_UNDEF) {
    if (absl::Status s = CheckStringTable(image, sections, shstrndx, "section name table");
        !s.ok()) {
      return s;
    }
  }

  std::map<std::string_view, const Section*> by_name;
  const Section* symtab = nullptr;
  for (Section& section : sections) {
    // sh_name 0 is the empty name, with or without a name table.
    if (section.header.sh_name != 0) {
      const char* name =
          shstrndx == SHN_UNDEF ? nullptr : elf_strptr(elf, shstrndx, section.header.sh_name);
      if (name == nullptr) {
        return Malformed(
            absl::StrCat("name of section ", section.index, ": ",
                         shstrndx == SHN_UNDEF ? "no section name table" : LibelfError()));
      }
      section.name = name;
    }
    by_name.emplace(section.name, &section);
    if (section.header.sh_type == SHT_SYMTAB && symtab == nullptr) {
      symtab = &section;
    }
  }
  auto find_section = [&](const std::string& name) -> const Section* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  if (symtab == nullptr) return Malformed("no symbol table");

  v1::CubinInfo info;
  info.set_elf_abi_version(header.e_ident[EI_ABIVERSION]);
  std::optional<Bytes> compat;
  if (const Section* section = find_section(".nv.compat"); section != nullptr) {
    absl::StatusOr<Bytes> data = SectionBytes(image, *section, ".nv.compat");
    if (!data.ok()) return data.status();
    compat = *data;
  }
  absl::StatusOr<std::string> arch = ReadArch(header, compat);
  if (!arch.ok()) return arch.status();
  info.set_arch(*arch);

  if (symtab->header.sh_entsize != sizeof(Elf64_Sym) ||
      symtab->header.sh_size % sizeof(Elf64_Sym) != 0) {
    return Malformed(
        absl::StrFormat("symbol table: sh_entsize %d and sh_size %d, want entries of %d bytes",
                        symtab->header.sh_entsize, symtab->header.sh_size, sizeof(Elf64_Sym)));
  }
  absl::StatusOr<Elf_Data*> symbol_data = SectionData(image, *symtab, "symbol table");
  if (!symbol_data.ok()) return symbol_data.status();
  const size_t strtab = symtab->header.sh_link;
  if (absl::Status s = CheckStringTable(image, sections, strtab, "symbol names"); !s.ok()) {
    return s;
  }
  const uint64_t symbol_count = symtab->header.sh_size / sizeof(Elf64_Sym);
  if (symbol_count > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    // gelf_getsym takes an int index.
    return Malformed(absl::StrFormat("%d symbols", symbol_count));
  }
  std::vector<GElf_Sym> symbols(symbol_count);
  std::vector<std::string_view> symbol_names(symbols.size());

  FunctionInfo functions;
  if (const Section* global = find_section(".nv.info"); global != nullptr) {
    absl::StatusOr<Bytes> data = SectionBytes(image, *global, ".nv.info");
    if (!data.ok()) return data.status();
    absl::StatusOr<FunctionInfo> read = ReadGlobalInfo(*data);
    if (!read.ok()) return read.status();
    functions = *std::move(read);
  }

  bool reserved_smem_in_sections = find_section(".nv.shared.reserved.0") != nullptr;
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (gelf_getsym(*symbol_data, static_cast<int>(i), &symbols[i]) == nullptr) {
      return Malformed(absl::StrCat("symbol ", i, ": ", LibelfError()));
    }
    const char* name = elf_strptr(elf, strtab, symbols[i].st_name);
    if (name == nullptr) {
      return Malformed(absl::StrCat("name of symbol ", i, ": ", LibelfError()));
    }
    symbol_names[i] = name;
    if (symbol_names[i] == ".nv.reservedSmem.offset0") {
      reserved_smem_in_sections = true;
    }
  }

  for (size_t i = 0; i < symbols.size(); ++i) {
    const GElf_Sym& symbol = symbols[i];
    if (GELF_ST_TYPE(symbol.st_info) != STT_FUNC) continue;
    const uint32_t shndx = symbol.st_shndx;
    if (shndx == SHN_UNDEF || shndx >= SHN_LORESERVE || shndx >= sections.size()) {
      continue;
    }
    const std::string name(symbol_names[i]);
    if (sections[shndx].name != ".text." + name) continue;
    const std::string info_name = ".nv.info." + name;
    const Section* kernel_info = find_section(info_name);
    if ((symbol.st_other & kStoCudaEntry) == 0 && kernel_info == nullptr) {
      continue;  // a device function
    }

    v1::KernelResources& kernel = *info.add_kernels();
    kernel.set_name(name);
    const uint32_t symbol_index = static_cast<uint32_t>(i);
    if (auto it = functions.registers.find(symbol_index); it != functions.registers.end()) {
      kernel.set_registers(it->second);
    } else {
      kernel.set_registers(sections[shndx].header.sh_info >> 24);
    }
    uint32_t local = 0;
    if (auto it = functions.frame_bytes.find(symbol_index); it != functions.frame_bytes.end()) {
      local = it->second;
    }
    // The cumulative stack adds callees' frames: what a launch must
    // provide per thread.
    if (auto it = functions.min_stack_bytes.find(symbol_index);
        it != functions.min_stack_bytes.end()) {
      local = std::max(local, it->second);
    }
    kernel.set_local_bytes(local);

    if (const Section* shared = find_section(".nv.shared." + name); shared != nullptr) {
      uint64_t smem = shared->header.sh_size;
      if (reserved_smem_in_sections) {
        smem = smem > kReservedSmemBytes ? smem - kReservedSmemBytes : 0;
      }
      if (smem > std::numeric_limits<uint32_t>::max()) {
        return Malformed(absl::StrFormat(".nv.shared.%s: size %d too large", name, smem));
      }
      kernel.set_static_smem_bytes(static_cast<uint32_t>(smem));
    }

    if (kernel_info != nullptr) {
      absl::StatusOr<Bytes> data = SectionBytes(image, *kernel_info, info_name);
      if (!data.ok()) return data.status();
      if (absl::Status s = ReadKernelInfo(*data, info_name, kernel); !s.ok()) {
        return s;
      }
    }
  }

  std::stable_sort(info.mutable_kernels()->begin(), info.mutable_kernels()->end(),
                   [](const v1::KernelResources& a, const v1::KernelResources& b) {
                     return a.name() < b.name();
                   });
  return info;
}

}  // namespace kforge
