// kforge's generated DSA indexer unit (compiler/indexer_codegen.cc,
// GenerateIndexerSource for sm_90a: the same three entries, which the
// module's JSON names; glm-5's 32 index heads, top-k 2048) with the e4m3
// mma.sync logits path forced on.
// sm_89 and sm_120a / sm_121a run that path natively and no such GPU is
// here: built for sm_90a (where ptxas expands the instruction), the H200
// runs the same fragment layout through check_dsa_indexer.py.
// tests/gpu/check_indexer_fp8_mma.sh builds and checks it.
#define KFORGE_INDEXER_FP8_MMA 1
#include "kforge/dsa_indexer/logits.cuh"
#include "kforge/dsa_indexer/topk.cuh"

namespace kdi = kforge::dsa_indexer;

using Traits = kdi::IndexerTraits<32, 2048>;

extern "C" __global__ void __launch_bounds__(Traits::kThreads, Traits::kLogitsMinBlocks)
    dsa_indexer_logits(const kdi::LogitsParams p) {
  kdi::LogitsMain<Traits>(p);
}

extern "C" __global__ void __launch_bounds__(Traits::kTopkThreads, Traits::kTopkMinBlocks)
    dsa_indexer_topk(const kdi::TopkParams p) {
  kdi::TopkMain<Traits>(p);
}

extern "C" __global__ void __cluster_dims__(kdi::kTopkClusterCtas, 1, 1)
    __launch_bounds__(Traits::kTopkThreads, Traits::kTopkMinBlocks)
        dsa_indexer_topk_cluster(const kdi::TopkParams p) {
  kdi::TopkMain<Traits, kdi::kTopkClusterCtas>(p);
}
