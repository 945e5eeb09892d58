// ref:any — the portable reference: the scalar codec of src/fp8, parallel over tokens with oneTBB.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "reshape_and_cache_internal.hpp"
#include "src/cache_layout.hpp"
#include "src/fp8.hpp"
#include "src/parallel.hpp"

namespace pagedattn {
namespace detail {
namespace {

std::string decline(const reshape_and_cache_problem &, const primitive_attr &) {
    return {};
}

// Per-token scale: the largest finite magnitude maps to the format's max. NaN is ignored and so is
// +-inf, which then saturates; an all-zero row gets FLT_MIN so that the division stays finite.
float per_token_scale(const float *row, dim n, float fp8_max_value) {
    float amax = 0.f;
    for (dim i = 0; i < n; ++i)
        if (std::isfinite(row[i])) amax = std::max(amax, std::fabs(row[i]));
    return std::max(amax / fp8_max_value, FLT_MIN);
}

void store_row(const float *row, dim n, const tensor_desc &cache, bool is_value, void *cache_data,
               float *scales, int mask, dim block, dim head, dim offset, dim kv_heads, dim block_size) {
    const data_type dt = cache.get_data_type();
    float scale = 1.f;
    if (mask == scales_per_token) {
        scale = per_token_scale(row, n, fp8_max(dt));
        scales[(block * kv_heads + head) * block_size + offset] = scale;
    } else if (mask == scales_per_kv_head) {
        scale = scales[head];
    } else if (mask == scales_per_tensor) {
        scale = scales[0];
    }
    const cache_view view(cache, is_value);
    if (!view.packed()) {
        char *dst = static_cast<char *>(cache_data) +
                    view.offset(block, head, offset, 0) * static_cast<dim>(data_type_size(dt));
        convert_row_from_f32(row, n, scale, dt, dst);
        return;
    }
    for (dim i = 0; i < n; ++i) {
        const float x = is_fp8(dt) ? row[i] / scale : row[i];
        store_from_f32(cache_data, dt, view.offset(block, head, offset, i), x);
    }
}

void execute(const reshape_and_cache_problem &p, const reshape_and_cache_arguments &a) {
    const dim d = p.head_size;
    parallel_for<dim>(0, a.num_tokens, 16, [&](dim first, dim last) {
        std::vector<float> row(static_cast<size_t>(d));
        for (dim t = first; t != last; ++t) {
            const dim slot = a.slots64 ? a.slots64[t] : a.slots32[t];
            if (slot < 0 || (a.superseded && a.superseded[t])) continue;
            const dim block = slot / p.block_size, offset = slot % p.block_size;
            for (dim h = 0; h < p.kv_heads; ++h) {
                const char *k = static_cast<const char *>(a.key) +
                                (t * a.key_token_stride + h * a.key_head_stride) *
                                        static_cast<dim>(data_type_size(p.key_type));
                convert_row_to_f32(k, p.key_type, d, 1.f, row.data());
                store_row(row.data(), d, p.k_cache, false, a.k_cache, a.k_scales, p.k_scales_mask, block, h,
                          offset, p.kv_heads, p.block_size);
                const char *v = static_cast<const char *>(a.value) +
                                (t * a.value_token_stride + h * a.value_head_stride) *
                                        static_cast<dim>(data_type_size(p.value_type));
                convert_row_to_f32(v, p.value_type, d, 1.f, row.data());
                store_row(row.data(), d, p.v_cache, true, a.v_cache, a.v_scales, p.v_scales_mask, block, h,
                          offset, p.kv_heads, p.block_size);
            }
        }
    });
}

} // namespace

const reshape_and_cache_implementation reshape_and_cache_ref = { "ref:any", cpu_isa::generic, decline,
                                                                 execute };

} // namespace detail
} // namespace pagedattn
