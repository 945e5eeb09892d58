// x64:avx512 — the x64 reshape_and_cache kernel with 16-lane f32 vectors (compiled with -mavx512f
// -mavx512bw -mavx512vl).
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

void encode_row_avx512(const float *src, int64_t n, float scale, data_type dt, void *dst) {
    x64_rac::encode_row_any<avx512_f32>(src, n, scale, dt, dst);
}

const reshape_and_cache_implementation reshape_and_cache_avx512 = { "x64:avx512", cpu_isa::avx512,
                                                                    x64_rac::decline<avx512_f32>,
                                                                    x64_rac::execute<avx512_f32> };

} // namespace detail
} // namespace pagedattn
