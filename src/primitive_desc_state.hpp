// What a primitive_desc holds: the chosen implementation and the resolved argument descriptors.
// Each primitive derives its own state; the public primitive_desc classes share it (handle
// semantics), and next_impl() swaps in a new one.
#pragma once

#include <memory>
#include <string>

#include "cpu_isa.hpp"
#include "error.hpp"
#include "verbose.hpp"

namespace pagedattn {
namespace detail {

struct primitive_desc_state {
    virtual ~primitive_desc_state() = default;
    virtual tensor_desc query_md(int arg) const = 0;
    /// The state of the next implementation in the list that accepts the problem, or null.
    virtual std::shared_ptr<primitive_desc_state> next() const = 0;

    dnnl::engine engine;
    primitive_attr attr;
    const char *impl_name = "";
    int impl_index = -1;
    /// Threads the scratchpad is sized for: the arena's concurrency when the pd was created.
    int max_threads = 1;
    size_t scratch_bytes_per_thread = 0;
    /// Bytes shared by the tasks of one execute (at most; a step may use less).
    size_t shared_scratch_bytes = 0;
    size_t scratchpad_bytes() const;
};

/// Walks `list` from `first`, returns the index of the first implementation that accepts the
/// problem on this host under the ISA caps, or -1. Implementation has `name`, `isa` and
/// `std::string (*decline)(const Problem &, const primitive_attr &)` (empty = accepts).
template <typename Implementation, typename Problem>
int find_implementation(const Implementation *const *list, int count, int first, const char *primitive,
                        const Problem &problem, const primitive_attr &attr) {
    const cpu_isa cap = effective_cpu_isa(attr);
    for (int i = first; i < count; ++i) {
        const Implementation &impl = *list[i];
        std::string reason;
        if (impl.isa > get_host_cpu_isa())
            reason = concat("the host lacks ", cpu_isa_name(impl.isa), " (", host_cpu_isa_limit(), ")");
        else if (impl.isa > cap)
            reason = concat("ISA capped at ", cpu_isa_name(cap));
        else
            reason = impl.decline(problem, attr);
        if (reason.empty()) return i;
        if (get_verbose() >= 3)
            verbose_print(concat("create:dispatch,", primitive, ",", impl.name, ",", reason));
    }
    return -1;
}

/// Engine check shared by every primitive_desc: the library runs on oneDNN's CPU engine only.
void check_engine(const char *primitive, const dnnl::engine &engine);

} // namespace detail
} // namespace pagedattn
