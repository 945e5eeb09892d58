// What the reshape_and_cache primitive hands its implementations: the problem fixed at creation and
// the validated arguments of one execute.
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/reshape_and_cache.hpp"

namespace pagedattn {
namespace detail {

struct reshape_and_cache_problem {
    data_type key_type, value_type;
    tensor_desc k_cache, v_cache; // resolved layouts
    dim kv_heads, head_size, block_size, num_blocks;
    int k_scales_mask, v_scales_mask; // -1: no scales
};

struct reshape_and_cache_arguments {
    dim num_tokens;
    const void *key, *value;
    dim key_token_stride, key_head_stride, value_token_stride, value_head_stride; // elements
    void *k_cache, *v_cache;
    const int64_t *slots64; // exactly one of the two is set
    const int32_t *slots32;
    /// Null, or one flag per token: 1 = another, later token of this call writes the same slot.
    const uint8_t *superseded;
    float *k_scales, *v_scales; // per-token scales are written, the others read
};

struct reshape_and_cache_implementation {
    const char *name;
    cpu_isa isa;
    std::string (*decline)(const reshape_and_cache_problem &, const primitive_attr &);
    void (*execute)(const reshape_and_cache_problem &, const reshape_and_cache_arguments &);
};

extern const reshape_and_cache_implementation *const reshape_and_cache_implementations[];
extern const int reshape_and_cache_implementation_count;

extern const reshape_and_cache_implementation reshape_and_cache_avx512;
extern const reshape_and_cache_implementation reshape_and_cache_avx2;
extern const reshape_and_cache_implementation reshape_and_cache_ref;

/// The vector row encoder of an x64 implementation: n f32 values to cache type dt exactly as
/// src/fp8.hpp's store_from_f32 does (FP8: of src[i] / scale, an f32 division; other types ignore
/// the scale; f32 quiets a signalling NaN). Defined in avx512.cpp / avx2.cpp, for the codec tests.
void encode_row_avx512(const float *src, int64_t n, float scale, data_type dt, void *dst);
void encode_row_avx2(const float *src, int64_t n, float scale, data_type dt, void *dst);
using row_encoder = void (*)(const float *src, int64_t n, float scale, data_type dt, void *dst);
/// encode_row_avx512 for cpu_isa::avx512, encode_row_avx2 for cpu_isa::avx2, when the library was
/// built with them (PAGEDATTN_ENABLE_X64); else null. The caller checks that the host runs them.
row_encoder reshape_and_cache_row_encoder(cpu_isa isa);

/// Whether x64:avx2's threshold encoder has the thresholds of this scale for cache type dt (FP8)
/// made at compile time (else it makes them as it encodes): for the tests. Defined in avx2.cpp.
bool threshold_table_holds_avx2(float scale, data_type dt);
using threshold_scale_check = bool (*)(float scale, data_type dt);
/// threshold_table_holds_avx2 when the library was built with the x64 kernels, else null.
threshold_scale_check reshape_and_cache_threshold_scale_check();

} // namespace detail
} // namespace pagedattn
