#ifndef KFORGE_MODEL_FORMAT_H_
#define KFORGE_MODEL_FORMAT_H_

namespace kforge {

// Version of everything kforge stores or sends about a kernel: the artifact
// layout, the manifest, the bundle layout and the cache-key recipe. Bumped
// on any change to them, so that an old cache entry is a miss and an old
// bundle is refused with a message naming both versions.
//   1: first release.
//   2: s_q left the kernel identity (key, module name, manifest variants);
//      the key holds NVRTC's full build identity; readable scale in module
//      names; cubins inspected without LLVM.
inline constexpr int kFormatVersion = 2;

}  // namespace kforge

#endif  // KFORGE_MODEL_FORMAT_H_
