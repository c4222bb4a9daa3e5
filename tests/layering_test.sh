#!/usr/bin/env bash
# What an inference engine links must carry no compiler: no LLVM, no NVRTC
# and none of the CUDA template text. Checked on the example engine binary
# and on the engine-side libraries, with the kforge CLI (which has all
# three) as the control that proves the probes find what they look for.
# usage: layering_test.sh KFORGE_BINARY EXAMPLE_BINARY LIBRARY...
set -uo pipefail
kforge=$1
example=$2
shift 2
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }

# Probes: symbol patterns (nm) and bytes (grep -a) that only a compiler or
# the embedded templates bring.
symbols_of() { { nm -C "$1"; nm -D "$1"; } 2>/dev/null; }
# (grep reads the whole list: with pipefail, an early exit would SIGPIPE nm.)
has_llvm() { symbols_of "$1" | grep -c 'llvm::' | grep -qv '^0$'; }
has_nvrtc() { symbols_of "$1" | grep -c 'nvrtc[A-Z]' | grep -qv '^0$'; }
# The include guard of the decode template: in the embedded text, never in
# code that only includes the plain-C++ headers (common/params.h, the
# parameter blocks).
has_templates() { grep -aq 'KFORGE_SPARSE_MLA_COMMON_DECODE_CUH_' "$1"; }

# Control: the CLI embeds the templates and links NVRTC.
has_nvrtc "$kforge" || fail "control: no NVRTC symbols found in $kforge (probe broken?)"
has_templates "$kforge" || fail "control: no template text found in $kforge (probe broken?)"

for f in "$example" "$@"; do
  [[ -e "$f" ]] || { fail "$f: missing"; continue; }
  has_llvm "$f" && fail "$f: contains LLVM symbols"
  has_nvrtc "$f" && fail "$f: references NVRTC"
  has_templates "$f" && fail "$f: contains the CUDA template text"
  echo "ok: $(basename "$f"): no LLVM, no NVRTC, no template text"
done
# The C ABI library (what the Python wheel ships) loads kernels through the
# module loader: the driver is dlopen()ed, never a link dependency (so the
# wheel imports without one and auditwheel grafts no libcuda), and it
# carries no gRPC.
for f in "$@"; do
  [[ "$(basename "$f")" == libkforge_capi.so ]] || continue
  grep -aq 'libcuda.so.1' "$f" || fail "control: $f does not name libcuda.so.1 (probe broken?)"
  if readelf -d "$f" | grep -E 'NEEDED' | grep -q 'libcuda'; then
    fail "$f: links libcuda: $(readelf -d "$f" | grep libcuda)"
  elif symbols_of "$f" | grep -c 'grpc' | grep -qv '^0$'; then
    fail "$f: contains gRPC symbols"
  else
    echo "ok: $(basename "$f"): libcuda only through dlopen, no gRPC"
  fi
done
if ldd "$example" | grep -Eq 'libLLVM|libnvrtc'; then
  fail "$example: dynamically links LLVM or NVRTC: $(ldd "$example" | grep -E 'libLLVM|libnvrtc')"
fi

# The kernel-family interface (compiler/family.h) is the compiler's: the
# engine side's sources include nothing of compiler/ (a family reaches
# them only as data, an artifact's entries), and the one module loader
# (runtime/kernel_module.*) names no kind, family or parameter struct.
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
grep -q '#include "compiler/family.h"' "$src/compiler/compiler.cc" ||
  fail "control: compiler/compiler.cc does not include compiler/family.h (probe broken?)"
if hits=$(grep -rlE '#include "compiler/' "$src"/{base,model,bundle,runtime,capi}); then
  fail "engine-side sources include the compiler: $(echo $hits)"
else
  echo "ok: base, model, bundle, runtime, capi include nothing of compiler/"
fi
kind_words='ATTENTION_KIND|sparse_mla|dsa_indexer|SparseMla|DsaIndexer|DecodeParams|CombineParams|LogitsParams|TopkParams'
if hits=$(grep -nE "$kind_words" "$src"/runtime/kernel_module.h "$src"/runtime/kernel_module.cc); then
  fail "runtime/kernel_module has kind-specific code: $hits"
else
  echo "ok: runtime/kernel_module names no kind"
fi
[[ $failed -eq 0 ]] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $failed
