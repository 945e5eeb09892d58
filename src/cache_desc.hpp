// Rules on the descriptors both primitives share: activation types and KV cache descriptors.
#pragma once

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

constexpr dim max_head_size = 512;

inline bool is_activation_type(data_type dt) {
    return dt == data_type::f32 || dt == data_type::bf16 || dt == data_type::f16;
}

/// Checks a KV cache descriptor ([num_blocks, Hkv, block_size, D]; f32/bf16/f16/f8) and resolves
/// its layout: `any` becomes dense plain (HND); plain keeps its strides (non-negative, unit on D).
/// `what` names the argument in the error.
tensor_desc resolve_cache_desc(const char *primitive, const char *what, const tensor_desc &d);

/// The scales masks of `attr` are only for FP8 caches.
void check_scales_attr(const char *primitive, const primitive_attr &attr, const tensor_desc &k_cache,
                       const tensor_desc &v_cache);

} // namespace detail
} // namespace pagedattn
