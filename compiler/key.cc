#include "compiler/key.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/sha256.h"
#include "compiler/embedded_templates.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace kforge {
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::Reflection;

// Every item in an encoding is "<decimal length>:<bytes>", so no choice of
// field values can make two different input lists encode to the same bytes
// (e.g. options {"-a b"} and {"-a", "b"}).
void AppendItem(std::string_view item, std::string* out) {
  absl::StrAppend(out, item.size(), ":");
  out->append(item);
}

std::string FloatBits(float value) {
  uint32_t bits;
  static_assert(sizeof(bits) == sizeof(value));
  std::memcpy(&bits, &value, sizeof(bits));
  return absl::StrFormat("f32:%08x", bits);
}

std::string DoubleBits(double value) {
  uint64_t bits;
  static_assert(sizeof(bits) == sizeof(value));
  std::memcpy(&bits, &value, sizeof(bits));
  return absl::StrFormat("f64:%016x", bits);
}

void AppendMessage(const Message& message, std::string* out);

// One value of a (possibly repeated) field; index < 0 means singular.
std::string FieldValue(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection& r = *message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(rep ? r.GetRepeatedInt32(message, field, index)
                              : r.GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r.GetRepeatedInt64(message, field, index)
                              : r.GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(rep ? r.GetRepeatedUInt32(message, field, index)
                              : r.GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r.GetRepeatedUInt64(message, field, index)
                              : r.GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r.GetRepeatedBool(message, field, index) : r.GetBool(message, field)) ? "true"
                                                                                          : "false";
    // Exact bits: a decimal rendering could round two scales to one key.
    case FieldDescriptor::CPPTYPE_FLOAT:
      return FloatBits(rep ? r.GetRepeatedFloat(message, field, index)
                           : r.GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return DoubleBits(rep ? r.GetRepeatedDouble(message, field, index)
                            : r.GetDouble(message, field));
    // The number, not the name: renaming an enum value changes no kernel.
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrCat(rep ? r.GetRepeatedEnumValue(message, field, index)
                              : r.GetEnumValue(message, field));
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string value;
      AppendItem(rep ? r.GetRepeatedString(message, field, index) : r.GetString(message, field),
                 &value);
      return value;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      std::string value = "{";
      AppendMessage(
          rep ? r.GetRepeatedMessage(message, field, index) : r.GetMessage(message, field), &value);
      value += "}";
      return value;
    }
  }
  return "?";  // unreachable: the switch covers every CppType
}

// Every field the descriptor declares (not only the set ones), in field-number
// order, as "name=value". Fields with explicit presence (proto3 `optional`,
// messages) encode "name=<unset>" when absent, so an unset rope_dim and
// rope_dim = 0 differ. A field added to the proto later changes every key
// without any change here. Unknown fields are ignored.
void AppendMessage(const Message& message, std::string* out) {
  const google::protobuf::Descriptor& descriptor = *message.GetDescriptor();
  std::vector<const FieldDescriptor*> fields;
  fields.reserve(descriptor.field_count());
  for (int i = 0; i < descriptor.field_count(); ++i) {
    fields.push_back(descriptor.field(i));
  }
  std::sort(fields.begin(), fields.end(), [](const FieldDescriptor* a, const FieldDescriptor* b) {
    return a->number() < b->number();
  });
  const Reflection& r = *message.GetReflection();
  for (const FieldDescriptor* field : fields) {
    std::string entry = absl::StrCat(field->name(), "=");
    if (field->is_repeated()) {
      // Map fields are repeated entries whose order is unspecified; none
      // exist in the spec and sorting them is left for when one does.
      const int size = r.FieldSize(message, field);
      absl::StrAppend(&entry, "[", size, "]");
      for (int i = 0; i < size; ++i) {
        AppendItem(FieldValue(message, field, i), &entry);
      }
    } else if (field->has_presence() && !r.HasField(message, field)) {
      entry += "<unset>";
    } else {
      entry += FieldValue(message, field, -1);
    }
    AppendItem(entry, out);
  }
}

}  // namespace

const std::string& TemplateDigest() {
  // The embedded set is fixed at build time, so hash it once.
  static const std::string* const kDigest = [] {
    std::string encoding;
    AppendItem("kforge-templates", &encoding);
    for (const EmbeddedFile& file : EmbeddedTemplates()) {
      AppendItem(file.path, &encoding);
      AppendItem(file.contents, &encoding);
    }
    return new std::string(Sha256Hex(encoding));
  }();
  return *kDigest;
}

std::string ComputeCacheKey(const KeyInputs& inputs) {
  std::string encoding;
  AppendItem(absl::StrCat("kforge-key-v", inputs.format_version), &encoding);

  std::string spec;
  AppendMessage(inputs.spec, &spec);
  AppendItem("spec", &encoding);
  AppendItem(spec, &encoding);

  AppendItem("template_digest", &encoding);
  AppendItem(inputs.template_digest, &encoding);
  AppendItem("nvrtc_version", &encoding);
  AppendItem(inputs.nvrtc_version, &encoding);

  AppendItem(absl::StrCat("options[", inputs.options.size(), "]"), &encoding);
  for (const std::string& option : inputs.options) {
    AppendItem(option, &encoding);
  }

  AppendItem("arch", &encoding);
  AppendItem(inputs.arch, &encoding);
  // How the unit is split into programs: the cubin images follow it.
  AppendItem(absl::StrCat("programs[", inputs.programs.size(), "]"), &encoding);
  for (const std::string& program : inputs.programs) AppendItem(program, &encoding);
  AppendItem("max_smem_per_block", &encoding);
  AppendItem(absl::StrCat(inputs.max_smem_per_block), &encoding);
  // Only a requested tiling is encoded, so the keys of planned kernels do
  // not depend on this field's existence.
  if (!inputs.tiling_request.empty()) {
    AppendItem("tiling_request", &encoding);
    AppendItem(inputs.tiling_request, &encoding);
  }
  // Likewise only where set: the other modules keep their keys.
  if (!inputs.small_batch_floor.empty()) {
    AppendItem("small_batch_floor", &encoding);
    AppendItem(inputs.small_batch_floor, &encoding);
  }
  return Sha256Hex(encoding);
}

}  // namespace kforge
