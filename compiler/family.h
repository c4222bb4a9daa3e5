#ifndef KFORGE_COMPILER_FAMILY_H_
#define KFORGE_COMPILER_FAMILY_H_

// A kernel family: one kind of kernel (a case of v1::KernelSpec) as the
// compiler sees it. KernelCompiler (Plan, Build) and the manifest (VariantOfPlan)
// dispatch through the registry below and never test the kind themselves,
// so a new kind is its own <kind>_family.cc plus one registration line in
// compiler/families.cc.
//
// Compiler side only: the engine side (runtime/, model/, capi/) never
// includes this header (tests/layering_test.sh); what an engine needs of a
// family reaches it as data, the artifact's and manifest's entries.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

class KernelFamily {
 public:
  explicit KernelFamily(v1::KernelSpec::KindCase kind) : kind_(kind) {}
  virtual ~KernelFamily() = default;

  // The case of KernelSpec this family compiles.
  v1::KernelSpec::KindCase kind() const { return kind_; }

  // Validation and normalization are the model library's
  // (NormalizeKernelSpec: the engine side checks specs with the same rule
  // and links no compiler); KernelCompiler::Plan applies them before Plan.

  // Completes `plan` (its spec normalized, its arch parsed with the
  // options' shared-memory cap applied): the module name, instantiation
  // unit, NVRTC options and cache key, and the family's own launch fields
  // (tiling, launch rule, small-batch and cluster paths). InvalidArgument
  // for options the family does not take.
  virtual absl::Status Plan(const PlanOptions& options, CompilePlan& plan) const = 0;

  // Every entry point the planned module exports, each with its role, its
  // schedule (attention entries) and the size of the parameter block it
  // takes. The cubin must export exactly these.
  virtual std::vector<v1::KernelEntry> Entries(const CompilePlan& plan) const = 0;

  // The family's part of the manifest variant (and so of the artifact):
  // the launch description its selector or plan reads and the entry names
  // it launches. VariantOfPlan adds module, key, spec and Entries.
  virtual void DescribeLaunch(const CompilePlan& plan, v1::ManifestVariant& variant) const = 0;

 private:
  v1::KernelSpec::KindCase kind_;
};

// The family registered for the spec's case; InvalidArgument naming the
// case and the registered ones otherwise.
absl::StatusOr<const KernelFamily*> FamilyFor(const v1::KernelSpec& spec);

// Every registered family, in registration order (one per kind).
std::vector<const KernelFamily*> RegisteredFamilies();

// An entry of `role` named `name` taking a `params_bytes` block, in a
// compiled-in cluster of `cluster_ctas` CTAs (0: none); a family adds the
// schedule of an attention entry.
v1::KernelEntry MakeEntry(const std::string& name, v1::EntryRole role, size_t params_bytes,
                          uint32_t cluster_ctas = 0);

// The key inputs every plan shares: its normalized spec, the templates,
// the compiler, its options and the arch (a family adds the rest).
KeyInputs PlanKeyInputs(const CompilePlan& plan);

}  // namespace kforge

#endif  // KFORGE_COMPILER_FAMILY_H_
