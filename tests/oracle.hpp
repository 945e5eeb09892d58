// fp64 naive paged attention, written from DESIGN §3 and sharing no code with the library: the
// expected values of the attention tests. Slow on purpose (one score at a time, in double).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference_formats.hpp"

namespace oracle {

using reference::format;

/// Query [T, Hq, D]: element (t, h, d) at data[t * token_stride + h * head_stride + d].
struct query {
    const void *data = nullptr;
    format fmt = format::f32;
    int64_t token_stride = 0, head_stride = 0;
};

/// How the dequantization scale of a cache element is found.
enum class scales {
    none,        ///< scale 1
    per_tensor,  ///< f32 [1]
    per_kv_head, ///< f32 [Hkv]
    per_token,   ///< f32 [num_blocks, Hkv, block_size], dense
};

/// A plain-layout paged cache: element (b, h, t, d) at data[b * block_stride + h * head_stride +
/// t * token_stride + d] (element strides); its value is decode(code) * scale.
struct paged_cache {
    const void *data = nullptr;
    format fmt = format::f32;
    int64_t block_stride = 0, head_stride = 0, token_stride = 0;
    scales scale_kind = scales::none;
    const float *scale_values = nullptr;
};

struct problem {
    int64_t num_heads = 0, num_kv_heads = 0, head_size = 0;
    int64_t block_size = 1, num_blocks = 0; // of the paged cache (unused by dense_attention)
    int64_t num_seqs = 0;
    const int32_t *seq_lens = nullptr;        // [S]
    const int32_t *query_start_loc = nullptr; // [S + 1]
    const int32_t *block_table = nullptr;     // [S, *] with row stride block_table_stride
    int64_t block_table_stride = 0;
    double softmax_scale = 1.0; // the value used, never "0 = default"
    bool causal = true;
    int64_t window_left = -1, window_right = -1;
    double soft_cap = 0.0;
    const float *alibi_slopes = nullptr; // [Hq] or null
    const float *sinks = nullptr;        // [Hq] or null
};

/// Everything is [T, Hq, D] (index (t * Hq + h) * D + d) unless stated.
struct result {
    int64_t tokens = 0, heads = 0, head_size = 0;
    std::vector<double> out;
    /// sum_j p_j * A_j * |v_jd - o_d| with A_j = scale * sum_e |q_e k_je| + |alibi_j| + |x_j| + |max|:
    /// how much o_d moves per unit of relative rounding of the scores (first-order sensitivity).
    std::vector<double> err_score;
    /// sum_j p_j * |v_jd|: the magnitude of the terms summed into o_d.
    std::vector<double> err_sum;
    /// sum_j |v_jd| over the visible j, unweighted: what probabilities that underflow can move.
    std::vector<double> v_abs_sum;
    /// Only from dense_attention with quantization bounds: the standard deviation of o_d when every
    /// K and V element carries an independent error uniform within its bound (first order) ...
    std::vector<double> quant_sigma;
    /// ... a second-order envelope sum_j p_j * sx_j^2 * |v_jd - o_d| (sx_j: sd of score j) ...
    std::vector<double> quant_second;
    /// ... and, per row [T, Hq], the largest sx_j (linearization holds while it is small).
    std::vector<double> quant_sigma_x_max;

    size_t index(int64_t t, int64_t h, int64_t d) const {
        return static_cast<size_t>((t * heads + h) * head_size + d);
    }
};

/// Attention of every query token against the paged cache, reading K and V through the block table.
result paged_attention(const problem &p, const query &q, const paged_cache &k, const paged_cache &v);

/// The same attention against unquantized K and V: k[s], v[s] are dense f32 [seq_len_s, Hkv, D].
/// When k_err and v_err are given (same shapes: a bound of each element's quantization error), the
/// quant_* fields are filled.
struct dense_kv {
    std::vector<const float *> k, v;
    std::vector<const float *> k_err, v_err;
};
result dense_attention(const problem &p, const query &q, const dense_kv &kv);

} // namespace oracle
