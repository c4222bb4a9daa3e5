#include "compiler/tuning.h"

namespace kforge {

const FormatTuning& SparseMlaTuning::format(v1::KvCacheDtype dtype) const {
  static const FormatTuning kNeither = {v1::KV_CACHE_DTYPE_UNSPECIFIED, false, false, false, false};
  for (const FormatTuning& f : formats) {
    if (f.dtype == dtype) return f;
  }
  return kNeither;
}

const SparseMlaTuning& TuningFor(const Arch& arch) {
  // One line per measured GPU generation. Every arch without its own table
  // uses Hopper's, the only one measured so far: the rules keep what does
  // not fit or exist there (wgmma, 16-CTA clusters) out of its modules.
  struct Row {
    int major;
    const SparseMlaTuning& (*table)();
  };
  static const Row kTables[] = {
      {9, &Sm90Tuning},
  };
  for (const Row& row : kTables) {
    if (row.major == arch.major) return row.table();
  }
  return Sm90Tuning();
}

}  // namespace kforge
