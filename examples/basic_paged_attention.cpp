// basic_paged_attention: the bare API. One sequence of 20 tokens is written into an FP8 KV cache of
// 16-token blocks by reshape_and_cache, then attended by paged_attention (one prefill step).
#include <pagedattn/pagedattn.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

using namespace pagedattn;

int main() {
    try {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        dnnl::stream strm(eng);
        const dim tokens = 20, q_heads = 4, kv_heads = 2, head_size = 64, block_size = 16, num_blocks = 4;

        // 1. Descriptors. The token count is a runtime dim; the cache shape and types are fixed.
        const tensor_desc q_md({ runtime_dim, q_heads, head_size }, data_type::f32);
        const tensor_desc kv_md({ runtime_dim, kv_heads, head_size }, data_type::f32);
        const tensor_desc cache_md({ num_blocks, kv_heads, block_size, head_size }, data_type::f8_e4m3,
                                   layout::any);
        primitive_attr attr; // FP8 with one scale per cached token, computed as tokens are written
        attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
        attr.set_scales_mask(ARG_V_CACHE, scales_per_token);

        // 2. Primitive descriptors pick an implementation. 3. Primitives: made once, run every step.
        reshape_and_cache::primitive_desc write_pd(
                eng, reshape_and_cache::desc(kv_md, kv_md, cache_md, cache_md), attr);
        paged_attention::primitive_desc attend_pd(eng, paged_attention::desc(q_md, cache_md, cache_md, q_md),
                                                  attr);
        reshape_and_cache write(write_pd);
        paged_attention attend(attend_pd);

        // Caches are allocated as the pd resolved layout::any; per-token scales are [blocks, heads, tokens].
        const tensor_desc k_cache_md = write_pd.query_md(ARG_K_CACHE),
                          v_cache_md = write_pd.query_md(ARG_V_CACHE);
        std::vector<uint8_t> k_cache(k_cache_md.get_size()), v_cache(v_cache_md.get_size());
        std::vector<float> k_scales(num_blocks * kv_heads * block_size), v_scales(k_scales.size());
        const tensor_desc scales_md({ num_blocks, kv_heads, block_size }, data_type::f32);

        // This step's inputs. The sequence owns cache blocks 2 and 0, in that order: token t goes to
        // slot block * block_size + t % block_size.
        std::vector<float> q(tokens * q_heads * head_size), dst(q.size());
        std::vector<float> k(tokens * kv_heads * head_size), v(k.size());
        for (size_t i = 0; i < q.size(); ++i)
            q[i] = std::sin(0.01f * static_cast<float>(i));
        for (size_t i = 0; i < k.size(); ++i) {
            k[i] = std::cos(0.02f * static_cast<float>(i));
            v[i] = std::sin(0.3f * static_cast<float>(i));
        }
        std::vector<int32_t> block_table = { 2, 0 }, seq_lens = { tokens }, query_start_loc = { 0, tokens };
        std::vector<int64_t> slot_mapping(tokens);
        for (dim t = 0; t < tokens; ++t)
            slot_mapping[t] = block_table[t / block_size] * block_size + t % block_size;

        // 4. Execute: write the new K/V into the cache, then attend.
        const tensor_desc q_step({ tokens, q_heads, head_size }, data_type::f32);
        const tensor_desc kv_step({ tokens, kv_heads, head_size }, data_type::f32);
        const tensor k_cache_t(k_cache_md, k_cache.data()), v_cache_t(v_cache_md, v_cache.data());
        const tensor k_scales_t(scales_md, k_scales.data()), v_scales_t(scales_md, v_scales.data());
        write.execute(strm, { { ARG_KEY, tensor(kv_step, k.data()) },
                              { ARG_VALUE, tensor(kv_step, v.data()) },
                              { ARG_K_CACHE, k_cache_t },
                              { ARG_V_CACHE, v_cache_t },
                              { ARG_K_SCALES, k_scales_t },
                              { ARG_V_SCALES, v_scales_t },
                              { ARG_SLOT_MAPPING,
                                tensor(tensor_desc({ tokens }, data_type::s64), slot_mapping.data()) } });
        attend.execute(strm, { { ARG_QUERY, tensor(q_step, q.data()) },
                               { ARG_DST, tensor(q_step, dst.data()) },
                               { ARG_K_CACHE, k_cache_t },
                               { ARG_V_CACHE, v_cache_t },
                               { ARG_K_SCALES, k_scales_t },
                               { ARG_V_SCALES, v_scales_t },
                               { ARG_BLOCK_TABLE,
                                 tensor(tensor_desc({ 1, 2 }, data_type::s32), block_table.data()) },
                               { ARG_SEQ_LENS, tensor(tensor_desc({ 1 }, data_type::s32), seq_lens.data()) },
                               { ARG_QUERY_START_LOC,
                                 tensor(tensor_desc({ 2 }, data_type::s32), query_start_loc.data()) } });
        strm.wait();

        const float *last = &dst[(tokens - 1) * q_heads * head_size]; // last token, head 0
        std::printf("reshape_and_cache: %s, paged_attention: %s\n", write_pd.impl_info_str(),
                    attend_pd.impl_info_str());
        std::printf("dst[last token][head 0][0..3] = %.4f %.4f %.4f %.4f\n", last[0], last[1], last[2],
                    last[3]);
        return std::isfinite(last[0]) ? 0 : 1;
    } catch (const pagedattn::error &e) {
        std::fprintf(stderr, "pagedattn error: %s\n", e.what());
        return 1;
    }
}
