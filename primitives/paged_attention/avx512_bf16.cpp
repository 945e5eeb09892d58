// x64:avx512_bf16 — the x64 kernel with scores by bf16 pair products (vdpbf16ps) on the packed
// layout, for bf16 queries and bf16/FP8 keys; values in f32 as in x64:avx512 (compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512bf16).
#define PAGEDATTN_X64_ISA avx512_bf16
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

const paged_attention_implementation paged_attention_avx512_bf16 = {
    "x64:avx512_bf16", cpu_isa::avx512_bf16, x64::avx512_bf16::decline<avx512_bf16_f32>,
    x64::avx512_bf16::scratch_bytes<avx512_bf16_f32>, x64::avx512_bf16::run_item<avx512_bf16_f32>
};

} // namespace detail
} // namespace pagedattn
