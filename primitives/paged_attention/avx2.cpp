// x64:avx2 — the x64 kernel with 8-lane f32 vectors (compiled with -mavx2 -mfma -mf16c).
#define PAGEDATTN_X64_ISA avx2
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {

const paged_attention_implementation paged_attention_avx2 = { "x64:avx2", cpu_isa::avx2,
                                                              x64::avx2::decline<avx2_f32>,
                                                              x64::avx2::scratch_bytes<avx2_f32>,
                                                              x64::avx2::run_item<avx2_f32> };

} // namespace detail
} // namespace pagedattn
