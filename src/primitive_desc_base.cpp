#include "primitive_desc_state.hpp"
#include "scratch.hpp"

namespace pagedattn {

namespace {
const detail::primitive_desc_state &checked(const std::shared_ptr<detail::primitive_desc_state> &state) {
    if (!state) detail::throw_error(status::invalid_arguments, "primitive_desc: the primitive_desc is empty");
    return *state;
}
} // namespace

const char *primitive_desc_base::impl_info_str() const {
    return checked(state_).impl_name;
}

bool primitive_desc_base::next_impl() {
    auto next = checked(state_).next();
    if (!next) return false;
    state_ = std::move(next);
    return true;
}

tensor_desc primitive_desc_base::query_md(int arg) const {
    if (arg == ARG_SCRATCHPAD) return scratchpad_desc();
    return checked(state_).query_md(arg);
}

tensor_desc primitive_desc_base::scratchpad_desc() const {
    const auto &state = checked(state_);
    if (state.attr.get_scratchpad_mode() != scratchpad_mode::user) return tensor_desc();
    return tensor_desc({ static_cast<dim>(state.scratchpad_bytes()) }, data_type::u8);
}

dnnl::engine primitive_desc_base::get_engine() const {
    return checked(state_).engine;
}

const primitive_attr &primitive_desc_base::get_primitive_attr() const {
    return checked(state_).attr;
}

namespace detail {

size_t primitive_desc_state::scratchpad_bytes() const {
    return user_scratchpad_bytes(scratch_bytes_per_thread, max_threads, shared_scratch_bytes);
}

void check_engine(const char *primitive, const dnnl::engine &engine) {
    if (!engine || engine.get_kind() != dnnl::engine::kind::cpu)
        throw_error(status::invalid_arguments,
                    concat(primitive, ": engine: expected a oneDNN CPU engine (dnnl::engine::kind::cpu)"));
}

} // namespace detail
} // namespace pagedattn
