#include "cache_desc.hpp"

#include "cache_layout.hpp"
#include "error.hpp"
#include "fp8.hpp"

namespace pagedattn {
namespace detail {

tensor_desc resolve_cache_desc(const char *primitive, const char *what, const tensor_desc &d) {
    auto fail = [&](const std::string &rule) {
        throw_error(status::invalid_arguments, concat(primitive, ": ", what, ": ", rule));
    };
    if (d.ndims() != 4)
        fail(concat("expected 4 dims [num_blocks, Hkv, block_size, D], got ", dims_string(d.get_dims())));
    const data_type dt = d.get_data_type();
    if (!is_activation_type(dt) && !is_fp8(dt))
        fail(concat("data type ", data_type_name(dt), " is not f32, bf16, f16, f8_e4m3 or f8_e5m2"));
    for (dim x : d.get_dims())
        if (x < 1) fail(concat("dims ", dims_string(d.get_dims()), " must all be >= 1"));
    if (d.get_dims()[3] > max_head_size) fail(concat("head size ", d.get_dims()[3], " is above 512"));
    const dims &x = d.get_dims();
    const bool packable = x[2] % packed_group == 0 && x[3] % packed_group == 0;
    if (d.get_layout() == layout::any) return tensor_desc(x, dt, packable ? layout::packed : layout::plain);
    for (dim s : d.get_strides())
        if (s < 0 || s == runtime_dim) fail("strides must be known and non-negative");
    if (d.get_layout() == layout::packed) {
        if (!packable)
            fail(concat("the packed layout needs block_size and head size multiples of 16, got ", x[2],
                        " and ", x[3]));
        const dims &s = d.get_strides();
        if (s[2] != x[3] || s[3] != 1)
            fail(concat("packed: the token and dim strides must be ", x[3], " and 1"));
        const dim region = x[2] * x[3];
        const dim element = static_cast<dim>(data_type_size(dt));
        for (int i = 0; i < 2; ++i)
            if (x[i] > 1 && ((s[i] * element) % 64 != 0 || s[i] < region))
                fail(concat(
                        "packed: the ", i == 0 ? "block" : "head", " stride ", s[i],
                        " must be a multiple of 64 bytes and at least block_size * head_size = ", region));
        return d;
    }
    if (d.get_strides()[3] != 1 && x[3] > 1) fail("the head dim must have unit stride");
    return d;
}

void check_scales_attr(const char *primitive, const primitive_attr &attr, const tensor_desc &k_cache,
                       const tensor_desc &v_cache) {
    for (int arg : { ARG_K_CACHE, ARG_V_CACHE }) {
        const data_type dt = (arg == ARG_K_CACHE ? k_cache : v_cache).get_data_type();
        if (attr.get_scales_mask(arg) >= 0 && !is_fp8(dt))
            throw_error(status::invalid_arguments,
                        concat(primitive, ": attribute scales for ", arg_name(arg),
                               ": scales belong to FP8 caches, this one is ", data_type_name(dt)));
    }
}

} // namespace detail
} // namespace pagedattn
