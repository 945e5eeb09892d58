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

extern const reshape_and_cache_implementation reshape_and_cache_ref;

} // namespace detail
} // namespace pagedattn
