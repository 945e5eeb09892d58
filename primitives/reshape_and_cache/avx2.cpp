// x64:avx2 — the x64 reshape_and_cache kernel with 8-lane f32 vectors (compiled with -mavx2 -mfma
// -mf16c).
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

void encode_row_avx2(const float *src, int64_t n, float scale, data_type dt, void *dst) {
    x64_rac::encode_row_any<avx2_f32>(src, n, scale, dt, dst);
}

bool threshold_table_holds_avx2(float scale, data_type dt) {
    using C = x64_rac::codec<avx2_f32>;
    return dt == data_type::f8_e4m3 ? C::fp8_threshold_table_holds<true>(scale)
                                    : C::fp8_threshold_table_holds<false>(scale);
}

const reshape_and_cache_implementation reshape_and_cache_avx2 = { "x64:avx2", cpu_isa::avx2,
                                                                  x64_rac::decline<avx2_f32>,
                                                                  x64_rac::execute<avx2_f32> };

} // namespace detail
} // namespace pagedattn
