#include "cache_desc.hpp"

#include "error.hpp"
#include "fp8.hpp"

namespace pagedattn {
namespace detail {

tensor_desc resolve_cache_desc(const char *primitive, const char *what, const tensor_desc &d) {
    auto fail = [&](const std::string &rule) {
        throw_error(status::invalid_arguments, concat(primitive, ": ", what, ": ", rule));
    };
    if (d.ndims() != 4) fail(concat("expected 4 dims [num_blocks, Hkv, block_size, D], got ", dims_string(d.get_dims())));
    const data_type dt = d.get_data_type();
    if (!is_activation_type(dt) && !is_fp8(dt))
        fail(concat("data type ", data_type_name(dt), " is not f32, bf16, f16, f8_e4m3 or f8_e5m2"));
    for (dim x : d.get_dims())
        if (x < 1) fail(concat("dims ", dims_string(d.get_dims()), " must all be >= 1"));
    if (d.get_dims()[3] > max_head_size) fail(concat("head size ", d.get_dims()[3], " is above 512"));
    if (d.get_layout() == layout::any) return tensor_desc(d.get_dims(), dt, layout::plain);
    for (dim s : d.get_strides())
        if (s < 0 || s == runtime_dim) fail("strides must be known and non-negative");
    if (d.get_strides()[3] != 1 && d.get_dims()[3] > 1) fail("the head dim must have unit stride");
    return d;
}

void check_scales_attr(const char *primitive, const primitive_attr &attr, const tensor_desc &k_cache,
        const tensor_desc &v_cache) {
    for (int arg : {ARG_K_CACHE, ARG_V_CACHE}) {
        const data_type dt = (arg == ARG_K_CACHE ? k_cache : v_cache).get_data_type();
        if (attr.get_scales_mask(arg) >= 0 && !is_fp8(dt))
            throw_error(status::invalid_arguments,
                    concat(primitive, ": attribute scales for ", arg_name(arg),
                            ": scales belong to FP8 caches, this one is ", data_type_name(dt)));
    }
}

} // namespace detail
} // namespace pagedattn
