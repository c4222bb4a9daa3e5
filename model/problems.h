#ifndef KFORGE_MODEL_PROBLEMS_H_
#define KFORGE_MODEL_PROBLEMS_H_

// Collects "field: got X, supported Y" problems (the one message shape of
// every kforge argument and spec check), in the order they are added, and
// joins them into one InvalidArgument.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace kforge {

class Problems {
 public:
  template <typename T>
  void Add(absl::string_view field, const T& got, absl::string_view supported) {
    items_.push_back(absl::StrCat(field, ": got ", got, ", supported ", supported));
  }
  void NonNull(absl::string_view field, uint64_t ptr) {
    if (ptr == 0) Add(field, "null", "a device address");
  }
  void Aligned(absl::string_view field, uint64_t value, int alignment) {
    if (value % alignment != 0) Add(field, value, absl::StrCat("a multiple of ", alignment));
  }
  void AtLeast(absl::string_view field, int64_t value, int64_t min) {
    if (value < min) Add(field, value, absl::StrCat(">= ", min));
  }
  absl::Status ToStatus() const {
    if (items_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(items_, "; "));
  }

 private:
  std::vector<std::string> items_;
};

}  // namespace kforge

#endif  // KFORGE_MODEL_PROBLEMS_H_
