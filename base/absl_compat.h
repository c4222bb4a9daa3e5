#ifndef KFORGE_BASE_ABSL_COMPAT_H_
#define KFORGE_BASE_ABSL_COMPAT_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace kforge {

// Debian's Abseil is built with ABSL_OPTION_USE_STD_STRING_VIEW 0, so
// absl::string_view is its own type and absl::StrCat & co. do not take a
// std::string_view. kforge's interfaces use std::string_view; convert here.
inline absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace kforge

#endif  // KFORGE_BASE_ABSL_COMPAT_H_
