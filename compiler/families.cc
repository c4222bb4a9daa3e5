// The registry of kernel families (compiler/family.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/family.h"
#include "compiler/nvrtc.h"

namespace kforge {

// One line per kind; each is defined in its own <kind>_family.cc.
const KernelFamily& SparseMlaDecodeFamily();
const KernelFamily& DsaIndexerFamily();

namespace {

const std::vector<const KernelFamily*>& Registry() {
  // Each kind once (families_test checks it).
  static const std::vector<const KernelFamily*>* const families =
      new std::vector<const KernelFamily*>{
          &SparseMlaDecodeFamily(),
          &DsaIndexerFamily(),
      };
  return *families;
}

// The case's field name ("sparse_mla_decode"), "none" when unset.
std::string CaseName(v1::KernelSpec::KindCase kind) {
  v1::KernelSpec spec;
  const google::protobuf::FieldDescriptor* field =
      v1::KernelSpec::descriptor()->FindFieldByNumber(kind);
  return field == nullptr ? "none" : field->name();
}

}  // namespace

absl::StatusOr<const KernelFamily*> FamilyFor(const v1::KernelSpec& spec) {
  for (const KernelFamily* family : Registry()) {
    if (family->kind() == spec.kind_case()) return family;
  }
  std::vector<std::string> names;
  for (const KernelFamily* family : Registry()) names.push_back(CaseName(family->kind()));
  return absl::InvalidArgumentError(absl::StrCat("kind: got ", CaseName(spec.kind_case()),
                                                 ", supported ", absl::StrJoin(names, " or ")));
}

std::vector<const KernelFamily*> RegisteredFamilies() { return Registry(); }

v1::KernelEntry MakeEntry(const std::string& name, v1::EntryRole role, size_t params_bytes,
                          uint32_t cluster_ctas) {
  v1::KernelEntry e;
  e.set_name(name);
  e.set_role(role);
  e.set_cluster_ctas(cluster_ctas);
  e.set_params_bytes(params_bytes);
  return e;
}

KeyInputs PlanKeyInputs(const CompilePlan& plan) {
  KeyInputs key;
  key.spec = plan.spec;
  key.template_digest = TemplateDigest();
  key.nvrtc_version = NvrtcBuildIdentity();
  key.options = plan.options;
  key.arch = plan.arch.name;
  for (const ProgramUnit& program : plan.programs) {
    key.programs.push_back(absl::StrJoin(program.entries, ","));
  }
  return key;
}

}  // namespace kforge
