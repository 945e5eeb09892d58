// Caches over 4 GiB (ctest label `large`): K and V caches of more than 2^32 bytes and 2^31 elements
// each, bf16 and FP8 (per-token scales), plain and packed, with the step's tokens written by
// reshape_and_cache to the highest slots and attended through the highest block ids: every offset
// the library computes must be 64-bit. The caches are reserved, not filled (anonymous mappings whose
// untouched pages cost no memory), so the test needs a few MiB of RAM and 4 x 4+ GiB of address space.
// Descriptors of absurd sizes (element counts or byte sizes overflowing 64 bits) are rejected.
#include <sys/mman.h>

#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;

/// Zero-filled memory of `bytes`, paged in only where touched.
class reserved_memory {
public:
    explicit reserved_memory(size_t bytes) : bytes_(bytes) {
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        data_ = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
    }
    ~reserved_memory() {
        if (data_) munmap(data_, bytes_);
    }
    reserved_memory(const reserved_memory &) = delete;
    reserved_memory &operator=(const reserved_memory &) = delete;
    char *data() const { return data_; }

private:
    size_t bytes_;
    char *data_;
};

struct large_case {
    format cache_fmt;
    int64_t num_blocks;
};

constexpr int64_t kv_heads = 2, q_heads = 8, head_size = 128, block_size = 16;

TEST(large_cache, over_4_gib_written_at_the_highest_slots_and_attended) {
    // Elements per cache: num_blocks x 2 x 16 x 128 = num_blocks x 4096, > 2^31 and > 2^32 bytes.
    for (const large_case lc : { large_case { format::bf16, (int64_t(1) << 19) + 37 },
                                 large_case { format::e4m3, (int64_t(1) << 20) + 37 } }) {
        const int64_t es = size_of(lc.cache_fmt), nb = lc.num_blocks;
        const int64_t cache_elements = nb * kv_heads * block_size * head_size;
        ASSERT_GT(cache_elements, int64_t(1) << 31);
        ASSERT_GT(cache_elements * es, int64_t(1) << 32);
        SCOPED_TRACE(std::string(name_of(lc.cache_fmt)) + " cache of " + std::to_string(cache_elements * es) +
                     " bytes per K and V");
        const bool fp8 = is_fp8(lc.cache_fmt);
        const scales token_scales = fp8 ? scales::per_token : scales::none;

        // The step: a prefill of 40 tokens (context 300), two decodes of 1000 and 17 tokens, whose blocks
        // are the cache's last ones, handed out from the top down.
        const std::vector<std::pair<int, int>> seqs { { 40, 300 }, { 1, 1000 }, { 1, 17 } };
        batch b;
        b.num_seqs = 3;
        b.block_size = block_size;
        b.num_blocks = nb;
        b.width = 1000 / block_size + 1;
        b.row_stride = b.width;
        b.query_start_loc.push_back(0);
        b.block_table.assign(static_cast<size_t>(b.num_seqs * b.row_stride), -1);
        int64_t next_block = nb - 1;
        for (int64_t s = 0; s < b.num_seqs; ++s) {
            const auto &qs = seqs[static_cast<size_t>(s)];
            b.q_lens.push_back(qs.first);
            b.seq_lens.push_back(qs.second);
            b.query_start_loc.push_back(b.query_start_loc.back() + qs.first);
            for (int64_t i = 0; i < (qs.second + block_size - 1) / block_size; ++i)
                b.block_table[static_cast<size_t>(s * b.row_stride + i)] = static_cast<int32_t>(next_block--);
        }
        b.tokens = b.query_start_loc.back();

        rng r(seed_of("large_cache"));
        std::vector<float> k_in, v_in, q_in(static_cast<size_t>(b.tokens * q_heads * head_size));
        std::vector<int64_t> slots;
        for (int64_t s = 0; s < b.num_seqs; ++s)
            for (int64_t j = 0; j < b.seq_lens[static_cast<size_t>(s)]; ++j) {
                slots.push_back(b.slot_of(s, j));
                for (int64_t i = 0; i < kv_heads * head_size; ++i) {
                    k_in.push_back(r.coarse_normal());
                    v_in.push_back(r.coarse_normal());
                }
            }
        ASSERT_EQ(slots.front(), nb * block_size - block_size) << "the first token sits in the last block";
        for (auto &x : q_in)
            x = r.coarse_normal();
        buffer q(q_in.size() * 2), key(k_in.size() * 2), value(v_in.size() * 2);
        for (size_t i = 0; i < q_in.size(); ++i)
            store_exact(q.data(), format::bf16, static_cast<int64_t>(i), q_in[i]);
        for (size_t i = 0; i < k_in.size(); ++i) {
            store_exact(key.data(), format::bf16, static_cast<int64_t>(i), k_in[i]);
            store_exact(value.data(), format::bf16, static_cast<int64_t>(i), v_in[i]);
        }
        const int64_t new_tokens = static_cast<int64_t>(slots.size());

        // A plain (HND) cache pair, read by the oracle, and the packed pair that layout::any gives.
        const pa::tensor_desc plain({ nb, kv_heads, block_size, head_size }, dt_of(lc.cache_fmt));
        const pa::tensor_desc any({ nb, kv_heads, block_size, head_size }, dt_of(lc.cache_fmt),
                                  pa::layout::any);
        pa::primitive_attr attr;
        if (fp8) {
            attr.set_scales_mask(pa::ARG_K_CACHE, scales_mask(token_scales));
            attr.set_scales_mask(pa::ARG_V_CACHE, scales_mask(token_scales));
        }
        const pa::tensor_desc kv_md({ pa::runtime_dim, kv_heads, head_size }, pa::data_type::bf16);
        const pa::tensor_desc scales_md({ nb, kv_heads, block_size }, pa::data_type::f32);
        reserved_memory k_scales(static_cast<size_t>(nb * kv_heads * block_size * 4)),
                v_scales(static_cast<size_t>(nb * kv_heads * block_size * 4));
        ASSERT_NE(k_scales.data(), nullptr);
        ASSERT_NE(v_scales.data(), nullptr);

        oracle::result ref;
        for (const pa::tensor_desc &layout_md : { plain, any }) {
            const pa::reshape_and_cache::primitive_desc rpd(
                    engine(), pa::reshape_and_cache::desc(kv_md, kv_md, layout_md, layout_md), attr);
            const pa::tensor_desc cache_md = rpd.query_md(pa::ARG_K_CACHE);
            SCOPED_TRACE(pa::layout_name(cache_md.get_layout()));
            ASSERT_EQ(cache_md.get_size(), static_cast<size_t>(cache_elements * es));
            reserved_memory k_cache(cache_md.get_size()), v_cache(cache_md.get_size());
            ASSERT_NE(k_cache.data(), nullptr) << "no address space for the cache";
            ASSERT_NE(v_cache.data(), nullptr) << "no address space for the cache";
            dnnl::stream st = make_stream();
            {
                const pa::tensor_desc run_md({ new_tokens, kv_heads, head_size }, pa::data_type::bf16);
                pa::exec_args a { { pa::ARG_KEY, pa::tensor(run_md, key.data()) },
                                  { pa::ARG_VALUE, pa::tensor(run_md, value.data()) },
                                  { pa::ARG_K_CACHE, pa::tensor(cache_md, k_cache.data()) },
                                  { pa::ARG_V_CACHE, pa::tensor(cache_md, v_cache.data()) },
                                  { pa::ARG_SLOT_MAPPING,
                                    pa::tensor(pa::tensor_desc({ new_tokens }, pa::data_type::s64),
                                               slots.data()) } };
                if (fp8) {
                    a[pa::ARG_K_SCALES] = pa::tensor(scales_md, k_scales.data());
                    a[pa::ARG_V_SCALES] = pa::tensor(scales_md, v_scales.data());
                }
                pa::reshape_and_cache(rpd).execute(st, a);
                st.wait();
            }
            if (cache_md.get_layout() == pa::layout::plain) {
                oracle::problem p;
                p.num_heads = q_heads;
                p.num_kv_heads = kv_heads;
                p.head_size = head_size;
                p.block_size = block_size;
                p.num_blocks = nb;
                p.num_seqs = b.num_seqs;
                p.seq_lens = b.seq_lens.data();
                p.query_start_loc = b.query_start_loc.data();
                p.block_table = b.block_table.data();
                p.block_table_stride = b.row_stride;
                p.softmax_scale = 1.0 / std::sqrt(static_cast<double>(head_size));
                oracle::query qv;
                qv.data = q.data();
                qv.fmt = format::bf16;
                qv.token_stride = q_heads * head_size;
                qv.head_stride = head_size;
                auto view = [&](const reserved_memory &m, const reserved_memory &sc) {
                    oracle::paged_cache c;
                    c.data = m.data();
                    c.fmt = lc.cache_fmt;
                    c.block_stride = kv_heads * block_size * head_size;
                    c.head_stride = block_size * head_size;
                    c.token_stride = head_size;
                    c.scale_kind = token_scales;
                    c.scale_values = fp8 ? reinterpret_cast<const float *>(sc.data()) : nullptr;
                    return c;
                };
                ref = oracle::paged_attention(p, qv, view(k_cache, k_scales), view(v_cache, v_scales));
            } else {
                ASSERT_EQ(cache_md.get_layout(), pa::layout::packed);
            }

            const pa::tensor_desc qmd({ pa::runtime_dim, q_heads, head_size }, pa::data_type::bf16);
            pa::paged_attention::primitive_desc pd(
                    engine(), pa::paged_attention::desc(qmd, cache_md, cache_md, qmd), attr);
            do {
                SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
                const pa::tensor_desc run_md({ b.tokens, q_heads, head_size }, pa::data_type::bf16);
                buffer dst(static_cast<size_t>(b.tokens * q_heads * head_size * 2));
                pa::exec_args a {
                    { pa::ARG_QUERY, pa::tensor(run_md, q.data()) },
                    { pa::ARG_K_CACHE, pa::tensor(cache_md, k_cache.data()) },
                    { pa::ARG_V_CACHE, pa::tensor(cache_md, v_cache.data()) },
                    { pa::ARG_BLOCK_TABLE,
                      pa::tensor(pa::tensor_desc({ b.num_seqs, b.width }, pa::data_type::s32),
                                 b.block_table.data()) },
                    { pa::ARG_SEQ_LENS,
                      pa::tensor(pa::tensor_desc({ b.num_seqs }, pa::data_type::s32), b.seq_lens.data()) },
                    { pa::ARG_QUERY_START_LOC,
                      pa::tensor(pa::tensor_desc({ b.num_seqs + 1 }, pa::data_type::s32),
                                 b.query_start_loc.data()) },
                    { pa::ARG_DST, pa::tensor(run_md, dst.data()) },
                };
                if (fp8) {
                    a[pa::ARG_K_SCALES] = pa::tensor(scales_md, k_scales.data());
                    a[pa::ARG_V_SCALES] = pa::tensor(scales_md, v_scales.data());
                }
                pa::paged_attention(pd).execute(st, a);
                st.wait();
                const comparison cmp = compare_attention(dst.data(), format::bf16, ref);
                EXPECT_EQ(cmp.failures, 0) << cmp;
                EXPECT_EQ(cmp.checked, b.tokens * q_heads * head_size);
            } while (pd.next_impl());
        }
    }
}

// Sizes whose element count or byte size does not fit 64 bits are invalid descriptors, and those
// that fit but cannot be allocated do not crash a primitive_desc (the caller allocates caches).
TEST(large_cache, absurd_sizes_are_rejected) {
    const int64_t huge = int64_t(1) << 62;
    for (pa::data_type dt : { pa::data_type::bf16, pa::data_type::f8_e4m3 }) {
        for (pa::layout l : { pa::layout::plain, pa::layout::any }) {
            try {
                const pa::tensor_desc cache({ huge, 64, 16, 128 }, dt, l);
                const pa::tensor_desc qmd({ pa::runtime_dim, 64, 128 }, pa::data_type::bf16);
                pa::paged_attention::primitive_desc pd(engine(),
                                                       pa::paged_attention::desc(qmd, cache, cache, qmd));
                ADD_FAILURE() << "a cache of 2^62 x 64 x 16 x 128 elements was accepted: " << cache.str();
            } catch (const pa::error &e) {
                EXPECT_EQ(e.get_status(), pa::status::invalid_arguments) << e.what();
            }
        }
    }
}

} // namespace
