#ifndef KFORGE_BASE_JSON_KEYS_H_
#define KFORGE_BASE_JSON_KEYS_H_

#include <string_view>

#include "absl/status/status.h"

namespace kforge {

// JSON parsers (protobuf's among them) take the last of two equal keys in
// one object, so a file that says one thing twice means the second without
// saying so. InvalidArgument naming the key and its line when an object holds
// a key twice. With `proto_names`, keys are compared as protobuf's JSON
// parser maps them to fields (case and '_' ignored: "num_q_heads" and
// "numQHeads" are one field). Anything else malformed is left to the parser.
absl::Status CheckNoDuplicateJsonKeys(std::string_view json, bool proto_names);

}  // namespace kforge

#endif  // KFORGE_BASE_JSON_KEYS_H_
