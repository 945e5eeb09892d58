// x64:avx512 — the x64 kernel with 16-lane f32 vectors (compiled with -mavx512f -mavx512bw -mavx512vl).
#define PAGEDATTN_X64_ISA avx512
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

void softmax_exp_avx512(const float *x, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += avx512_f32::width)
        avx512_f32::store(out + i, exp_negative<avx512_f32>(avx512_f32::load(x + i)));
}

const paged_attention_implementation paged_attention_avx512 = { "x64:avx512", cpu_isa::avx512,
                                                                x64::avx512::decline<avx512_f32>,
                                                                x64::avx512::scratch_bytes<avx512_f32>,
                                                                x64::avx512::run_item<avx512_f32> };

} // namespace detail
} // namespace pagedattn
