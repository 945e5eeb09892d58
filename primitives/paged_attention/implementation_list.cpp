// The implementations of paged_attention, most capable first, the portable reference last. The
// primitive_desc, the tests and the benchmark all walk this one list.
#include "paged_attention_internal.hpp"

namespace pagedattn {
namespace detail {

const paged_attention_implementation *const paged_attention_implementations[] = {
#if PAGEDATTN_X64
    &paged_attention_amx, &paged_attention_avx512_bf16, &paged_attention_avx512, &paged_attention_avx2,
#endif
    &paged_attention_ref,
};
const int paged_attention_implementation_count =
        sizeof(paged_attention_implementations) / sizeof(paged_attention_implementations[0]);

softmax_exp paged_attention_softmax_exp(cpu_isa isa) {
#if PAGEDATTN_X64
    if (isa == cpu_isa::avx512) return softmax_exp_avx512;
    if (isa == cpu_isa::avx2) return softmax_exp_avx2;
#endif
    (void)isa;
    return nullptr;
}

} // namespace detail
} // namespace pagedattn
