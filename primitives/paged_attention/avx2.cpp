// x64:avx2 — the x64 kernel with 8-lane f32 vectors (compiled with -mavx2 -mfma -mf16c).
#define PAGEDATTN_X64_ISA avx2
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

void softmax_exp_avx2(const float *x, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += avx2_f32::width)
        avx2_f32::store(out + i, exp_negative<avx2_f32>(avx2_f32::load(x + i)));
}

const paged_attention_implementation paged_attention_avx2 = { "x64:avx2", cpu_isa::avx2,
                                                              x64::avx2::decline<avx2_f32>,
                                                              x64::avx2::scratch_bytes<avx2_f32>,
                                                              x64::avx2::run_item<avx2_f32> };

} // namespace detail
} // namespace pagedattn
