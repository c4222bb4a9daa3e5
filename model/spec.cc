#include "model/spec.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/absl_compat.h"
#include "base/io.h"
#include "base/json_keys.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kforge/v1/spec.pb.h"
#include "model/format.h"
#include "model/indexer_spec.h"
#include "model/problems.h"
#include "templates/kforge/sparse_mla/common/kv_layout.h"

namespace kforge {
namespace {

std::string_view AsStd(absl::string_view s) { return {s.data(), s.size()}; }

// Limits of the template family (docs/DESIGN.md). Each is what the kernels are
// written for, not a hardware limit.
constexpr uint32_t kMaxQHeads = 128;
constexpr uint32_t kLoraRankStep = 64;  // one MMA k-block of bf16 columns
constexpr uint32_t kMaxLoraRank = 512;
constexpr uint32_t kRopeDim = 64;
constexpr uint32_t kMaxTopk = 16384;
constexpr uint32_t kMaxSq = 4;  // plain decode plus up to 3 MTP tokens
constexpr uint32_t kMaxPageBlockSize = 4096;

// Enum names for messages; an out-of-range value (proto3 enums are open)
// prints as its number.
std::string KindName(int value) {
  const std::string& name = v1::AttentionKind_Name(value);
  return name.empty() ? absl::StrCat(value) : name;
}

std::string ScaleFormatName(int value) {
  const std::string& name = v1::KvScaleFormat_Name(value);
  return name.empty() ? absl::StrCat(value) : name;
}

std::string DtypeName(int value) {
  const std::string& name = v1::KvCacheDtype_Name(value);
  return name.empty() ? absl::StrCat(value) : name;
}

constexpr double kLog2e = 1.4426950408889634;

// Text-format parse errors with their 1-based line and column.
class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back(absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    // Warnings (e.g. deprecated fields) do not fail a parse; keep them only
    // to explain a later error.
    AddError(line, column, message);
  }
  std::string Joined() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::vector<std::string> errors_;
};

// A cache's dtype and scale format (the spec's, or its extra_kv's: field
// names start with `prefix`) against the KvFormats table and the spec's
// geometry.
void CheckKvDtype(Problems& problems, absl::string_view prefix, v1::KvCacheDtype dtype,
                  v1::KvScaleFormat scale_format, const v1::AttentionSpec& spec) {
  const KvFormatInfo* kv = FindKvFormat(dtype);
  if (kv == nullptr) {
    std::vector<std::string> names;
    for (const KvFormatInfo& f : KvFormats()) names.push_back(v1::KvCacheDtype_Name(f.dtype));
    problems.Add(absl::StrCat(prefix, "kv_cache_dtype"), DtypeName(dtype),
                 absl::StrJoin(names, ", "));
    return;
  }
  // A quantised record exists for one geometry (kv_layout.h): other latent
  // widths have no such record in any engine.
  const int rank = static_cast<int>(spec.kv_lora_rank());
  const int rope = static_cast<int>(spec.rope_dim());
  if (kv->supports != nullptr && !kv->supports(rank, rope)) {
    // Name the field that is off: the rope when the rank has a record.
    const bool rank_ok = kv->supports(rank, 0) || kv->supports(rank, kRopeDim);
    problems.Add(rank_ok ? "rope_dim" : "kv_lora_rank", rank_ok ? rope : rank,
                 absl::StrCat(kv->geometry, " with ", prefix, "kv_cache_dtype ", kv->name));
  }
  const std::string field = absl::StrCat(prefix, "kv_scale_format");
  if (kv->takes_scale_format) {
    if (scale_format != v1::KV_SCALE_FORMAT_POW2 && scale_format != v1::KV_SCALE_FORMAT_ARBITRARY) {
      problems.Add(field, ScaleFormatName(scale_format),
                   absl::StrCat("KV_SCALE_FORMAT_POW2 or KV_SCALE_FORMAT_ARBITRARY (required with ",
                                prefix, "kv_cache_dtype ", kv->name, ")"));
    }
  } else if (scale_format != v1::KV_SCALE_FORMAT_UNSPECIFIED) {
    problems.Add(field, ScaleFormatName(scale_format),
                 absl::StrCat("unset (", prefix, "kv_cache_dtype ", kv->name,
                              " takes none: its scales, if any, are part of the record)"));
  }
}

// "<what>: got \"<name>\", supported <names>"; the name escaped, as it may
// be any bytes a file holds.
std::string UnknownName(absl::string_view what, absl::string_view name, absl::string_view names) {
  return absl::StrCat(what, ": got \"", absl::CHexEscape(name), "\", supported ", names);
}

std::string KvDtypeNames() {
  std::vector<absl::string_view> names;
  for (const KvFormatInfo& f : KvFormats()) names.push_back(f.name);
  return absl::StrCat(absl::StrJoin(names, ", "), " (or the KV_CACHE_DTYPE_* names)");
}

// The scale formats that have a short name: every value of the enum but
// UNSPECIFIED, in the enum's order.
std::vector<v1::KvScaleFormat> NamedScaleFormats() {
  std::vector<v1::KvScaleFormat> formats;
  const google::protobuf::EnumDescriptor* type = v1::KvScaleFormat_descriptor();
  for (int i = 0; i < type->value_count(); ++i) {
    const auto format = static_cast<v1::KvScaleFormat>(type->value(i)->number());
    if (format != v1::KV_SCALE_FORMAT_UNSPECIFIED) formats.push_back(format);
  }
  return formats;
}

std::string KvScaleFormatNames() {
  std::vector<std::string> names;
  for (v1::KvScaleFormat f : NamedScaleFormats()) names.push_back(KvScaleFormatName(f));
  return absl::StrCat(absl::StrJoin(names, ", "), " (or the KV_SCALE_FORMAT_* names)");
}

// The enums whose fields spec files and matrices may spell short.
bool TakesShortNames(const google::protobuf::EnumDescriptor* type) {
  return type == v1::KvCacheDtype_descriptor() || type == v1::KvScaleFormat_descriptor();
}

// The enum name protobuf's parsers take for `name`, written in the field
// at `path` of enum `type` (one that TakesShortNames): `name` itself when
// it is one of the enum's names (UNSPECIFIED too: validation names that).
absl::StatusOr<std::string> EnumValueName(const google::protobuf::EnumDescriptor& type,
                                          const std::string& name, absl::string_view path) {
  if (type.FindValueByName(name) != nullptr) return name;
  if (&type == v1::KvCacheDtype_descriptor()) {
    absl::StatusOr<v1::KvCacheDtype> dtype = ParseKvDtype(name);
    if (dtype.ok()) return v1::KvCacheDtype_Name(*dtype);
    return absl::InvalidArgumentError(UnknownName(path, name, KvDtypeNames()));
  }
  absl::StatusOr<v1::KvScaleFormat> format = ParseKvScaleFormat(name);
  if (format.ok()) return v1::KvScaleFormat_Name(*format);
  return absl::InvalidArgumentError(UnknownName(path, name, KvScaleFormatNames()));
}

std::string FieldPath(absl::string_view parent, absl::string_view field) {
  return parent.empty() ? std::string(field) : absl::StrCat(parent, ".", field);
}

// The field a JSON key names, in either spelling protobuf's JSON parser
// takes (the proto name or the lowerCamelCase JSON name); null for none.
const google::protobuf::FieldDescriptor* FieldOfJsonKey(const google::protobuf::Descriptor& message,
                                                        const std::string& key) {
  for (int i = 0; i < message.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = message.field(i);
    if (key == field->name() || key == field->json_name()) return field;
  }
  return nullptr;
}

absl::Status ExpandJsonMessage(const google::protobuf::Descriptor& message,
                               google::protobuf::Value& value, const std::string& path);

// One JSON value of `field` (an element, for a repeated field).
absl::Status ExpandJsonValue(const google::protobuf::FieldDescriptor& field,
                             google::protobuf::Value& value, const std::string& path) {
  if (field.message_type() != nullptr) return ExpandJsonMessage(*field.message_type(), value, path);
  if (!TakesShortNames(field.enum_type()) ||
      value.kind_case() != google::protobuf::Value::kStringValue) {
    return absl::OkStatus();  // numbers and wrong types are the parser's to judge
  }
  absl::StatusOr<std::string> name = EnumValueName(*field.enum_type(), value.string_value(), path);
  if (!name.ok()) return name.status();
  value.set_string_value(*std::move(name));
  return absl::OkStatus();
}

absl::Status ExpandJsonMessage(const google::protobuf::Descriptor& message,
                               google::protobuf::Value& value, const std::string& path) {
  if (value.kind_case() != google::protobuf::Value::kStructValue) return absl::OkStatus();
  for (auto& [key, item] : *value.mutable_struct_value()->mutable_fields()) {
    const google::protobuf::FieldDescriptor* field = FieldOfJsonKey(message, key);
    if (field == nullptr || field->is_map()) continue;
    const std::string at = FieldPath(path, key);
    if (field->is_repeated() && item.kind_case() == google::protobuf::Value::kListValue) {
      auto& items = *item.mutable_list_value()->mutable_values();
      for (int i = 0; i < items.size(); ++i) {
        absl::Status s = ExpandJsonValue(*field, items[i], absl::StrCat(at, "[", i, "]"));
        if (!s.ok()) return s;
      }
    } else if (absl::Status s = ExpandJsonValue(*field, item, at); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// JSON -> any-JSON tree -> short names expanded (ExpandKvEnumNames) ->
// `out` (an AttentionSpec or a KernelSpec). The detour through
// google.protobuf.Value costs one extra parse of a small file and keeps the
// enum fields typed.
absl::StatusOr<google::protobuf::Value> ParseJsonTree(std::string_view text) {
  if (absl::Status s = CheckNoDuplicateJsonKeys(text, /*proto_names=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON spec: ", s.message()));
  }
  google::protobuf::Value tree;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &tree);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON spec: ", std::string(status.message())));
  }
  return tree;
}

absl::Status ParseJson(google::protobuf::Value tree, google::protobuf::Message& out) {
  if (absl::Status s = ExpandKvEnumNames(*out.GetDescriptor(), tree); !s.ok()) return s;
  std::string json;
  // Printing a Value that was just parsed cannot fail.
  (void)google::protobuf::util::MessageToJsonString(tree, &json);
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &out, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON spec: ", std::string(status.message())));
  }
  return absl::OkStatus();
}

// io::Tokenizer's columns count a tab as reaching the next multiple of 8
// (its ColumnNumber documentation; the constant is private).
constexpr int kTokenizerTabWidth = 8;

// The byte offset of a tokenizer position (0-based line and column).
size_t ByteOffset(std::string_view text, const std::vector<size_t>& line_starts, int line,
                  int column) {
  size_t i = line_starts[line];
  for (int col = 0; col < column && i < text.size(); ++i) {
    col = text[i] == '\t' ? col + kTokenizerTabWidth - col % kTokenizerTabWidth : col + 1;
  }
  return i;
}

class IgnoreErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

// Text proto's counterpart of ExpandKvEnumNames: `text` with every value
// of a KvCacheDtype or KvScaleFormat field (the spec's or extra_kv's)
// that is a short name, as an identifier or a string, replaced by its enum
// name. Tokenized as TextFormat's parser does, following the nesting of
// AttentionSpec's messages; syntax errors are left for that parser.
absl::StatusOr<std::string> ExpandTextProtoKvEnumNames(const google::protobuf::Descriptor& message,
                                                       std::string_view text) {
  using google::protobuf::io::Tokenizer;
  std::vector<size_t> line_starts = {0};
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') line_starts.push_back(i + 1);
  }
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreErrors errors;
  Tokenizer tokenizer(&input, &errors);
  // TextFormat::Parser's settings.
  tokenizer.set_allow_f_after_float(true);
  tokenizer.set_comment_style(Tokenizer::SH_COMMENT_STYLE);
  tokenizer.set_require_space_after_number(false);
  tokenizer.set_allow_multiline_strings(true);
  struct Scope {
    const google::protobuf::Descriptor* message;  // null inside a field it does not have
    std::string path;
  };
  std::vector<Scope> scopes = {{&message, ""}};
  struct Replacement {
    size_t begin;
    size_t size;
    std::string name;
  };
  std::vector<Replacement> replacements;
  const google::protobuf::FieldDescriptor* field = nullptr;  // named by the last identifier
  bool value_next = false;                                   // field, then ':'
  while (tokenizer.Next()) {
    const Tokenizer::Token& token = tokenizer.current();
    const bool is_name =
        token.type == Tokenizer::TYPE_IDENTIFIER || token.type == Tokenizer::TYPE_STRING;
    if (value_next && is_name && TakesShortNames(field->enum_type())) {
      std::string value = token.text;
      if (token.type == Tokenizer::TYPE_STRING) Tokenizer::ParseString(token.text, &value);
      absl::StatusOr<std::string> name =
          EnumValueName(*field->enum_type(), value, FieldPath(scopes.back().path, field->name()));
      if (!name.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", token.line + 1, " column ", token.column + 1, ": ", name.status().message()));
      }
      if (*name != token.text) {
        replacements.push_back({ByteOffset(text, line_starts, token.line, token.column),
                                token.text.size(), *std::move(name)});
      }
    } else if (!value_next && token.type == Tokenizer::TYPE_IDENTIFIER) {
      field = scopes.back().message == nullptr ? nullptr
                                               : scopes.back().message->FindFieldByName(token.text);
      if (field != nullptr) continue;
    } else if (field != nullptr && token.text == ":") {
      value_next = true;
      continue;
    } else if (token.text == "{" || token.text == "<") {
      const bool known = field != nullptr && field->message_type() != nullptr;
      scopes.push_back({known ? field->message_type() : nullptr,
                        known ? FieldPath(scopes.back().path, field->name()) : ""});
    } else if ((token.text == "}" || token.text == ">") && scopes.size() > 1) {
      scopes.pop_back();
    }
    field = nullptr;
    value_next = false;
  }
  std::string out(text);
  for (auto r = replacements.rbegin(); r != replacements.rend(); ++r) {
    out.replace(r->begin, r->size, r->name);
  }
  return out;
}

absl::Status ParseTextProto(std::string_view text, google::protobuf::Message& out) {
  absl::StatusOr<std::string> expanded = ExpandTextProtoKvEnumNames(*out.GetDescriptor(), text);
  if (!expanded.ok()) return expanded.status();
  CollectErrors errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  parser.AllowUnknownExtension(false);
  if (!parser.ParseFromString(*expanded, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid text-proto spec: ", errors.Joined()));
  }
  return absl::OkStatus();
}

// Whether a spec text is a KernelSpec (its top level names a case of
// KernelSpec.kind) rather than the flat form of an AttentionSpec with its
// kind field, which files written before KernelSpec use.
bool IsKernelSpecForm(std::string_view text, const google::protobuf::Value* json_tree) {
  const google::protobuf::OneofDescriptor& cases = *v1::KernelSpec::descriptor()->oneof_decl(0);
  auto names_case = [&cases](absl::string_view name) {
    for (int i = 0; i < cases.field_count(); ++i) {
      if (name == cases.field(i)->name() || name == cases.field(i)->json_name()) return true;
    }
    return false;
  };
  if (json_tree != nullptr) {
    if (json_tree->kind_case() != google::protobuf::Value::kStructValue) return false;
    for (const auto& [key, value] : json_tree->struct_value().fields()) {
      if (names_case(key)) return true;
    }
    return false;
  }
  // Text proto: the first identifier is the first field's name.
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreErrors errors;
  google::protobuf::io::Tokenizer tokenizer(&input, &errors);
  tokenizer.set_comment_style(google::protobuf::io::Tokenizer::SH_COMMENT_STYLE);
  if (!tokenizer.Next()) return false;
  return tokenizer.current().type == google::protobuf::io::Tokenizer::TYPE_IDENTIFIER &&
         names_case(tokenizer.current().text);
}

// Spec files written before KernelSpec named the kind beside the sparse MLA
// fields (`kind: ATTENTION_KIND_SPARSE_MLA_DECODE`); AttentionSpec has no
// such field now. These drop that one field so the file still reads as the
// spec it was; any other kind there stays, for the parser to refuse.
constexpr std::string_view kFlatSparseKind = "ATTENTION_KIND_SPARSE_MLA_DECODE";

bool IsIdentifierChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Text proto: each `kind: ATTENTION_KIND_SPARSE_MLA_DECODE` (the only
// message with a kind field was the spec itself) becomes blanks.
std::string DropFlatSparseKind(absl::string_view text) {
  std::string out(text);
  for (size_t at = out.find(kFlatSparseKind); at != std::string::npos;
       at = out.find(kFlatSparseKind, at + 1)) {
    const size_t end = at + kFlatSparseKind.size();
    if (end < out.size() && IsIdentifierChar(out[end])) continue;
    size_t i = at;
    while (i > 0 && absl::ascii_isspace(out[i - 1])) --i;
    if (i == 0 || out[i - 1] != ':') continue;
    --i;
    while (i > 0 && absl::ascii_isspace(out[i - 1])) --i;
    if (i < 4 || out.compare(i - 4, 4, "kind") != 0) continue;
    i -= 4;
    if (i > 0 && IsIdentifierChar(out[i - 1])) continue;
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(i),
              out.begin() + static_cast<std::ptrdiff_t>(end), ' ');
  }
  return out;
}

// A flat spec text that failed to parse as an AttentionSpec because it names
// a kind or the indexer's fields (as flat spec files did before KernelSpec):
// the error says how such a spec is written now.
absl::Status WithKernelSpecHint(const absl::Status& status, absl::string_view text) {
  if (!absl::StrContains(text, "kind") && !absl::StrContains(text, "index_head")) return status;
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(),
                   " (a spec names its kind by its top-level field: sparse_mla_decode { ... } or "
                   "dsa_indexer { index_heads: ... }, in JSON {\"dsa_indexer\": {...}}; the flat "
                   "form is a sparse MLA spec's fields alone)"));
}

// A KernelSpec with no case, refused where one is read.
absl::Status NoKindError() {
  return absl::InvalidArgumentError(
      "kind: got none, supported sparse_mla_decode or dsa_indexer (a KernelSpec names its kind)");
}

// KernelSpecOf a spec that was made or checked, its error as it is.
template <typename Spec>
absl::StatusOr<v1::KernelSpec> KernelSpecOfResult(const absl::StatusOr<Spec>& spec) {
  if (!spec.ok()) return spec.status();
  return KernelSpecOf(*spec);
}

// -0 is not a scale anyone means, and the JSON printer drops it (it reads
// back as +0): make it +0 so a parsed spec prints and reads back the same
// (found by fuzz/spec_fuzzer; validation then refuses the scale either way).
void ClearNegativeZeroScale(v1::AttentionSpec& spec) {
  if (spec.softmax_scale() == 0.0f) spec.set_softmax_scale(0.0f);
}

}  // namespace

absl::Status ValidateSpec(const v1::AttentionSpec& spec) {
  Problems problems;
  if (spec.num_q_heads() < 1 || spec.num_q_heads() > kMaxQHeads) {
    problems.Add("num_q_heads", spec.num_q_heads(), absl::StrCat("1..", kMaxQHeads));
  }
  if (spec.kv_lora_rank() < kLoraRankStep || spec.kv_lora_rank() > kMaxLoraRank ||
      spec.kv_lora_rank() % kLoraRankStep != 0) {
    problems.Add(
        "kv_lora_rank", spec.kv_lora_rank(),
        absl::StrCat("a multiple of ", kLoraRankStep, " in ", kLoraRankStep, "..", kMaxLoraRank));
  }
  if (!spec.has_rope_dim()) {
    problems.Add("rope_dim", "unset", absl::StrCat("0 or ", kRopeDim, " (required)"));
  } else if (spec.rope_dim() != 0 && spec.rope_dim() != kRopeDim) {
    problems.Add("rope_dim", spec.rope_dim(), absl::StrCat("0 or ", kRopeDim));
  }
  if (spec.topk() < 1 || spec.topk() > kMaxTopk) {
    problems.Add("topk", spec.topk(), absl::StrCat("1..", kMaxTopk));
  }
  // s_q is optional (0 = not given) and does not change the kernel; a
  // given value is still checked so a typo is not silently accepted.
  if (spec.s_q() > kMaxSq) {
    problems.Add("s_q", spec.s_q(), absl::StrCat("0 (not given) or 1..", kMaxSq));
  }
  CheckKvDtype(problems, "", spec.kv_cache_dtype(), spec.kv_scale_format(), spec);
  if (spec.page_block_size() < 1 || spec.page_block_size() > kMaxPageBlockSize) {
    problems.Add("page_block_size", spec.page_block_size(), absl::StrCat("1..", kMaxPageBlockSize));
  }
  // The kernel is built with softmax_scale * log2(e) as a float constant
  // (codegen), which must be finite too: 3e38 passed here and then failed in
  // NVRTC on "inff".
  if (!std::isfinite(spec.softmax_scale()) || !(spec.softmax_scale() > 0.0f) ||
      !std::isfinite(static_cast<float>(static_cast<double>(spec.softmax_scale()) * kLog2e))) {
    problems.Add("softmax_scale", spec.softmax_scale(),
                 absl::StrFormat("finite, > 0 and at most %.6g (softmax_scale * log2(e) must be "
                                 "a finite float)",
                                 std::numeric_limits<float>::max() / kLog2e));
  }
  // return_lse: both values are supported.
  if (spec.has_extra_kv()) {
    const v1::ExtraKvCache& x = spec.extra_kv();
    CheckKvDtype(problems, "extra_kv.", x.kv_cache_dtype(), x.kv_scale_format(), spec);
    if (x.topk() < 1 || x.topk() > kMaxTopk) {
      problems.Add("extra_kv.topk", x.topk(), absl::StrCat("1..", kMaxTopk));
    }
    if (x.page_block_size() < 1 || x.page_block_size() > kMaxPageBlockSize) {
      problems.Add("extra_kv.page_block_size", x.page_block_size(),
                   absl::StrCat("1..", kMaxPageBlockSize));
    }
  }
  return problems.ToStatus();
}

absl::StatusOr<v1::AttentionSpec> NormalizeSpec(const v1::AttentionSpec& spec) {
  if (absl::Status status = ValidateSpec(spec); !status.ok()) return status;
  v1::AttentionSpec normalized = spec;
  // A spec decoded from the wire may carry fields from a newer schema; they
  // cannot influence a kernel this build generates, and keeping them would
  // make equal kernels hash differently.
  normalized.DiscardUnknownFields();
  // Presence is part of the serialized bytes: make it explicit so that a
  // NoPE spec always serializes with rope_dim written out.
  normalized.set_rope_dim(spec.rope_dim());
  // s_q does not change the kernel (every query token carries its own
  // indices): cleared so that s_q 1 and 2 are one key, one module, one
  // manifest variant.
  normalized.clear_s_q();
  return normalized;
}

const std::vector<PresetInfo>& Presets() {
  // Values from docs/DESIGN.md. softmax_scale is the model's own (DeepSeek-V3.2:
  // 192^-0.5 * yarn mscale^2; GLM-5: 256^-0.5), never (d_qk)^-0.5.
  static const std::vector<PresetInfo>* const kPresets = new std::vector<PresetInfo>{
      {"deepseek-v3.2", 128, 512, 64, 2048, 0.135234f, v1::KV_SCALE_FORMAT_POW2},
      {"glm-5", 64, 512, 64, 2048, 0.0625f, v1::KV_SCALE_FORMAT_ARBITRARY},
  };
  return *kPresets;
}

absl::StatusOr<v1::AttentionSpec> SpecFromPreset(std::string_view name, int64_t tensor_parallel,
                                                 v1::KvCacheDtype kv_dtype) {
  const PresetInfo* preset = FindPreset(name);
  if (preset == nullptr) {
    std::vector<absl::string_view> known;
    for (const PresetInfo& p : Presets()) known.push_back(p.name);
    return absl::InvalidArgumentError(
        absl::StrCat("preset: got \"", AsAbsl(name), "\", supported ", absl::StrJoin(known, ", ")));
  }
  if (tensor_parallel < 1 || preset->total_heads % tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel: got ", tensor_parallel,
                                                   ", supported a divisor of ", preset->total_heads,
                                                   " (", preset->name, " heads)"));
  }
  v1::AttentionSpec spec;
  spec.set_num_q_heads(preset->total_heads / tensor_parallel);
  spec.set_kv_lora_rank(preset->kv_lora_rank);
  spec.set_rope_dim(preset->rope_dim);
  spec.set_topk(preset->topk);
  spec.set_page_block_size(64);
  spec.set_softmax_scale(preset->softmax_scale);
  spec.set_return_lse(true);
  return NormalizeSpec(SpecWithKvDtype(
      spec, kv_dtype == v1::KV_CACHE_DTYPE_UNSPECIFIED ? v1::KV_CACHE_DTYPE_BF16 : kv_dtype,
      preset->kv_scale_format));
}

absl::StatusOr<v1::KernelSpec> SpecOfSelector(const v1::KernelSelector& selector) {
  switch (selector.source_case()) {
    case v1::KernelSelector::kSpec:
      if (selector.spec().kind_case() == v1::KernelSpec::KIND_NOT_SET) return NoKindError();
      return selector.spec();
    case v1::KernelSelector::kPreset: {
      const v1::PresetRef& preset = selector.preset();
      if (preset.kind() == v1::ATTENTION_KIND_DSA_INDEXER) {
        if (preset.kv_cache_dtype() != v1::KV_CACHE_DTYPE_UNSPECIFIED) {
          return absl::InvalidArgumentError(absl::StrCat(
              "kv_cache_dtype: got ", KvDtypeName(preset.kv_cache_dtype()),
              ", supported unset (ATTENTION_KIND_DSA_INDEXER: the index-key cache is fp8)"));
        }
        return KernelSpecOfResult(
            IndexerSpecFromPreset(preset.name(), int64_t{preset.tensor_parallel()}));
      }
      if (preset.kind() != v1::ATTENTION_KIND_UNSPECIFIED &&
          preset.kind() != v1::ATTENTION_KIND_SPARSE_MLA_DECODE) {
        return absl::InvalidArgumentError(
            absl::StrCat("kind: got ", KindName(preset.kind()),
                         ", supported ATTENTION_KIND_SPARSE_MLA_DECODE or "
                         "ATTENTION_KIND_DSA_INDEXER"));
      }
      return KernelSpecOfResult(SpecFromPreset(preset.name(), int64_t{preset.tensor_parallel()},
                                               preset.kv_cache_dtype()));
    }
    default:
      return absl::InvalidArgumentError(
          "kernel: got nothing, supported a spec or a preset (name + tensor_parallel)");
  }
}

const PresetInfo* FindPreset(std::string_view name) {
  for (const PresetInfo& p : Presets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

v1::AttentionSpec SpecWithKvDtype(const v1::AttentionSpec& spec, v1::KvCacheDtype kv_dtype,
                                  v1::KvScaleFormat default_scale_format) {
  v1::AttentionSpec out = spec;
  out.set_kv_cache_dtype(kv_dtype);
  const KvFormatInfo* kv = FindKvFormat(kv_dtype);
  if (kv == nullptr || !kv->takes_scale_format) {
    out.clear_kv_scale_format();
  } else if (out.kv_scale_format() == v1::KV_SCALE_FORMAT_UNSPECIFIED) {
    out.set_kv_scale_format(default_scale_format);
  }
  return out;
}

absl::StatusOr<v1::AttentionSpec> ParseSpec(std::string_view text) {
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(AsAbsl(text));
  if (absl::StripTrailingAsciiWhitespace(body).empty()) {
    return absl::InvalidArgumentError("spec text is empty");
  }
  v1::AttentionSpec spec;
  absl::Status parsed;
  if (body.front() == '{') {
    absl::StatusOr<google::protobuf::Value> tree = ParseJsonTree(AsStd(body));
    if (!tree.ok()) return tree.status();
    DropFlatSparseKind(*tree);
    parsed = ParseJson(*std::move(tree), spec);
  } else {
    parsed = ParseTextProto(DropFlatSparseKind(AsAbsl(text)), spec);
  }
  if (!parsed.ok()) return WithKernelSpecHint(parsed, body);
  ClearNegativeZeroScale(spec);
  return spec;
}

void DropFlatSparseKind(google::protobuf::Value& tree) {
  if (tree.kind_case() != google::protobuf::Value::kStructValue) return;
  auto& fields = *tree.mutable_struct_value()->mutable_fields();
  auto it = fields.find("kind");
  if (it != fields.end() && it->second.kind_case() == google::protobuf::Value::kStringValue &&
      it->second.string_value() == kFlatSparseKind) {
    fields.erase(it);
  }
}

v1::KernelSpec KernelSpecOf(const v1::AttentionSpec& spec) {
  v1::KernelSpec out;
  *out.mutable_sparse_mla_decode() = spec;
  return out;
}

v1::KernelSpec KernelSpecOf(const v1::DsaIndexerSpec& spec) {
  v1::KernelSpec out;
  *out.mutable_dsa_indexer() = spec;
  return out;
}

v1::AttentionKind KindOf(const v1::KernelSpec& spec) {
  switch (spec.kind_case()) {
    case v1::KernelSpec::kSparseMlaDecode:
      return v1::ATTENTION_KIND_SPARSE_MLA_DECODE;
    case v1::KernelSpec::kDsaIndexer:
      return v1::ATTENTION_KIND_DSA_INDEXER;
    case v1::KernelSpec::KIND_NOT_SET:
      break;
  }
  return v1::ATTENTION_KIND_UNSPECIFIED;
}

std::string KindCaseName(const v1::KernelSpec& spec) {
  if (spec.kind_case() == v1::KernelSpec::KIND_NOT_SET) return "none";
  return v1::KernelSpec::descriptor()->FindFieldByNumber(spec.kind_case())->name();
}

absl::StatusOr<v1::KernelSpec> ParseSpecText(std::string_view text) {
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(AsAbsl(text));
  if (absl::StripTrailingAsciiWhitespace(body).empty()) {
    return absl::InvalidArgumentError("spec text is empty");
  }
  const bool json = body.front() == '{';
  absl::StatusOr<google::protobuf::Value> tree;
  if (json) {
    tree = ParseJsonTree(AsStd(body));
    if (!tree.ok()) return tree.status();
  }
  if (!IsKernelSpecForm(text, json ? &*tree : nullptr)) {
    // The flat form: a sparse MLA spec's fields at the top level.
    absl::StatusOr<v1::AttentionSpec> flat = ParseSpec(text);
    if (!flat.ok()) return flat.status();
    return KernelSpecOf(*flat);
  }
  v1::KernelSpec spec;
  if (json) {
    if (absl::Status s = ParseJson(*std::move(tree), spec); !s.ok()) return s;
  } else if (absl::Status s = ParseTextProto(text, spec); !s.ok()) {
    return s;
  }
  if (spec.has_sparse_mla_decode()) ClearNegativeZeroScale(*spec.mutable_sparse_mla_decode());
  return spec;
}

namespace {

// The contents of a spec file, errors naming it.
absl::StatusOr<std::string> ReadSpecFile(const std::string& path) {
  // A FIFO or device (/dev/zero) is refused from its type, without reading
  // it: --spec on a FIFO hung, on /dev/zero it aborted with bad_alloc.
  absl::StatusOr<std::string> read = ReadFile(path, kMaxSpecFileBytes, Symlinks::kFollow);
  if (absl::IsNotFound(read.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": no such spec file"));
  }
  if (absl::IsFailedPrecondition(read.status())) {
    return absl::InvalidArgumentError(absl::StrCat("spec file ", read.status().message()));
  }
  return read;
}

template <typename T>
absl::StatusOr<T> NameFile(const std::string& path, absl::StatusOr<T> parsed) {
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<v1::AttentionSpec> LoadSpecFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadSpecFile(path);
  if (!contents.ok()) return contents.status();
  return NameFile(path, ParseSpec(*contents));
}

absl::StatusOr<v1::KernelSpec> LoadKernelSpecFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadSpecFile(path);
  if (!contents.ok()) return contents.status();
  return NameFile(path, ParseSpecText(*contents));
}

absl::StatusOr<v1::KernelSpec> NormalizeKernelSpec(const v1::KernelSpec& spec) {
  switch (spec.kind_case()) {
    case v1::KernelSpec::kSparseMlaDecode:
      return KernelSpecOfResult(NormalizeSpec(spec.sparse_mla_decode()));
    case v1::KernelSpec::kDsaIndexer:
      return KernelSpecOfResult(NormalizeIndexerSpec(spec.dsa_indexer()));
    case v1::KernelSpec::KIND_NOT_SET:
      break;
  }
  return NoKindError();
}

namespace {

using sparse_mla::KvBf16Sizes;
using sparse_mla::KvFp8DsMlaSizes;
using sparse_mla::KvFp8DsMlaV4Sizes;
using sparse_mla::KvMxfp8DsMlaV41Sizes;
using sparse_mla::KvNvfp4DsMlaSizes;

}  // namespace

const std::vector<KvFormatInfo>& KvFormats() {
  static const std::vector<KvFormatInfo> kFormats = {
      {v1::KV_CACHE_DTYPE_BF16, "bf16", "ks::KvBf16", false, KvBf16Sizes::kPageBlocked, nullptr, "",
       &KvBf16Sizes::BytesPerToken, &KvBf16Sizes::StagingBytesPerToken, 2},
      {v1::KV_CACHE_DTYPE_FP8_DS_MLA, "fp8_ds_mla", "ks::KvFp8DsMla", true,
       KvFp8DsMlaSizes::kPageBlocked, &KvFp8DsMlaSizes::Supports,
       "kv_lora_rank 512 with rope_dim 0 or 64", &KvFp8DsMlaSizes::BytesPerToken,
       &KvFp8DsMlaSizes::StagingBytesPerToken, 1},
      {v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, "fp8_ds_mla_v4", "ks::KvFp8DsMlaV4", false,
       KvFp8DsMlaV4Sizes::kPageBlocked, &KvFp8DsMlaV4Sizes::Supports,
       "kv_lora_rank 512 with rope_dim 0 (d_qk = d_v = 512: 448 e4m3 + 64 bf16 columns)",
       &KvFp8DsMlaV4Sizes::BytesPerToken, &KvFp8DsMlaV4Sizes::StagingBytesPerToken, 1},
      {v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, "mxfp8_ds_mla_v41", "ks::KvMxfp8DsMlaV41", false,
       KvMxfp8DsMlaV41Sizes::kPageBlocked, &KvMxfp8DsMlaV41Sizes::Supports,
       "kv_lora_rank 512 with rope_dim 0 (d_qk = d_v = 512, all e4m3)",
       &KvMxfp8DsMlaV41Sizes::BytesPerToken, &KvMxfp8DsMlaV41Sizes::StagingBytesPerToken, 1},
      {v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, "nvfp4_ds_mla", "ks::KvNvfp4DsMla", false,
       KvNvfp4DsMlaSizes::kPageBlocked, &KvNvfp4DsMlaSizes::Supports,
       "kv_lora_rank 512 with rope_dim 64", &KvNvfp4DsMlaSizes::BytesPerToken,
       &KvNvfp4DsMlaSizes::StagingBytesPerToken, 1},
  };
  return kFormats;
}

const KvFormatInfo* FindKvFormat(v1::KvCacheDtype dtype) {
  for (const KvFormatInfo& f : KvFormats()) {
    if (f.dtype == dtype) return &f;
  }
  return nullptr;
}

const KvFormatInfo& KvFormatOf(const v1::AttentionSpec& spec) {
  const KvFormatInfo* kv = FindKvFormat(spec.kv_cache_dtype());
  return kv != nullptr ? *kv : KvFormats().front();
}

const KvFormatInfo* ExtraKvFormatOf(const v1::AttentionSpec& spec) {
  if (!spec.has_extra_kv()) return nullptr;
  const KvFormatInfo* kv = FindKvFormat(spec.extra_kv().kv_cache_dtype());
  return kv != nullptr ? kv : &KvFormats().front();
}

std::string KvDtypeName(v1::KvCacheDtype dtype) {
  const KvFormatInfo* f = FindKvFormat(dtype);
  return f != nullptr ? f->name : DtypeName(dtype);
}

absl::StatusOr<v1::KvCacheDtype> ParseKvDtype(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AsAbsl(name));
  for (const KvFormatInfo& f : KvFormats()) {
    if (lower == f.name) return f.dtype;
  }
  v1::KvCacheDtype dtype;
  if (v1::KvCacheDtype_Parse(std::string(name), &dtype) &&
      dtype != v1::KV_CACHE_DTYPE_UNSPECIFIED) {
    return dtype;
  }
  return absl::InvalidArgumentError(UnknownName("kv dtype", AsAbsl(name), KvDtypeNames()));
}

std::string KvScaleFormatName(v1::KvScaleFormat format) {
  const std::string& name = v1::KvScaleFormat_Name(format);
  if (format == v1::KV_SCALE_FORMAT_UNSPECIFIED || name.empty()) return ScaleFormatName(format);
  return absl::AsciiStrToLower(absl::StripPrefix(name, "KV_SCALE_FORMAT_"));
}

absl::StatusOr<v1::KvScaleFormat> ParseKvScaleFormat(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AsAbsl(name));
  for (v1::KvScaleFormat format : NamedScaleFormats()) {
    if (lower == KvScaleFormatName(format)) return format;
  }
  v1::KvScaleFormat format;
  if (v1::KvScaleFormat_Parse(std::string(name), &format) &&
      format != v1::KV_SCALE_FORMAT_UNSPECIFIED) {
    return format;
  }
  return absl::InvalidArgumentError(
      UnknownName("kv scale format", AsAbsl(name), KvScaleFormatNames()));
}

absl::Status ExpandKvEnumNames(const google::protobuf::Descriptor& message,
                               google::protobuf::Value& tree) {
  return ExpandJsonMessage(message, tree, "");
}

}  // namespace kforge
