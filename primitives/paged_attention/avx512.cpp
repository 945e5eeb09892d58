// x64:avx512 — the x64 kernel with 16-lane f32 vectors (compiled with -mavx512f -mavx512bw -mavx512vl).
#define PAGEDATTN_X64_ISA avx512
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

const paged_attention_implementation paged_attention_avx512 = { "x64:avx512", cpu_isa::avx512,
                                                                x64::avx512::decline<avx512_f32>,
                                                                x64::avx512::scratch_bytes<avx512_f32>,
                                                                x64::avx512::run_item<avx512_f32> };

} // namespace detail
} // namespace pagedattn
