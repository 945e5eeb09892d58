#include "error.hpp"

namespace pagedattn {

primitive_attr::primitive_attr() = default;

void primitive_attr::set_scales_mask(int arg, int mask) {
    if (arg != ARG_K_CACHE && arg != ARG_V_CACHE)
        detail::throw_error(status::invalid_arguments,
                            detail::concat("primitive_attr: scales are set on k_cache or v_cache, not on ",
                                           arg_name(arg), " (", arg, ")"));
    if (mask != scales_per_tensor && mask != scales_per_kv_head && mask != scales_per_token)
        detail::throw_error(status::invalid_arguments,
                            detail::concat("primitive_attr: scales mask ", mask, " for ", arg_name(arg),
                                           " is not one of 0 (per tensor), 2 (per kv head), 7 (per token)"));
    (arg == ARG_K_CACHE ? k_scales_mask_ : v_scales_mask_) = mask;
}

int primitive_attr::get_scales_mask(int arg) const {
    if (arg == ARG_K_CACHE) return k_scales_mask_;
    if (arg == ARG_V_CACHE) return v_scales_mask_;
    return -1;
}

bool primitive_attr::operator==(const primitive_attr &other) const {
    return k_scales_mask_ == other.k_scales_mask_ && v_scales_mask_ == other.v_scales_mask_ &&
           scratchpad_mode_ == other.scratchpad_mode_ && fpmath_mode_ == other.fpmath_mode_ &&
           max_cpu_isa_ == other.max_cpu_isa_;
}

} // namespace pagedattn
