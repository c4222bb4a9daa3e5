#ifndef KFORGE_COMPILER_EMBEDDED_TEMPLATES_H_
#define KFORGE_COMPILER_EMBEDDED_TEMPLATES_H_

#include <string_view>
#include <vector>

namespace kforge {

// A template header compiled into the kforge binary.
struct EmbeddedFile {
  std::string_view path;  // include name, e.g. "kforge/sparse_mla/common/decode.cuh"
  std::string_view contents;
};

// All headers under templates/, sorted by path (generated at build time).
const std::vector<EmbeddedFile>& EmbeddedTemplates();

}  // namespace kforge

#endif  // KFORGE_COMPILER_EMBEDDED_TEMPLATES_H_
