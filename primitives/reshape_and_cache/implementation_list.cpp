// The implementations of reshape_and_cache, most capable first, the portable reference last.
#include "reshape_and_cache_internal.hpp"

namespace pagedattn {
namespace detail {

const reshape_and_cache_implementation *const reshape_and_cache_implementations[] = {
    &reshape_and_cache_ref,
};
const int reshape_and_cache_implementation_count =
        sizeof(reshape_and_cache_implementations) / sizeof(reshape_and_cache_implementations[0]);

} // namespace detail
} // namespace pagedattn
