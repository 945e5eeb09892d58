// The implementations of reshape_and_cache, most capable first, the portable reference last.
#include "reshape_and_cache_internal.hpp"

namespace pagedattn {
namespace detail {

const reshape_and_cache_implementation *const reshape_and_cache_implementations[] = {
#if PAGEDATTN_X64
    &reshape_and_cache_avx512,
    &reshape_and_cache_avx2,
#endif
    &reshape_and_cache_ref,
};
const int reshape_and_cache_implementation_count =
        sizeof(reshape_and_cache_implementations) / sizeof(reshape_and_cache_implementations[0]);

row_encoder reshape_and_cache_row_encoder(cpu_isa isa) {
#if PAGEDATTN_X64
    if (isa == cpu_isa::avx512) return encode_row_avx512;
    if (isa == cpu_isa::avx2) return encode_row_avx2;
#endif
    (void)isa;
    return nullptr;
}

threshold_scale_check reshape_and_cache_threshold_scale_check() {
#if PAGEDATTN_X64
    return threshold_table_holds_avx2;
#else
    return nullptr;
#endif
}

} // namespace detail
} // namespace pagedattn
