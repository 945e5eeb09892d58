// The packed, ISA-neutral KV cache layout (layout::packed, include/pagedattn/common.hpp):
//  - layout::any resolves to packed (dense strides) where block_size and D are multiples of 16 and
//    to dense plain otherwise, the same for both primitives, every implementation and every cap;
//  - packed descriptors with caller-set block/head strides are accepted, bad ones rejected;
//  - the bytes reshape_and_cache writes sit where the layout's definition puts them (the index math
//    below is the test's own, written from the definition), and equal those of a plain cache;
//  - paged_attention on a packed cache matches the fp64 oracle run on the same data in a plain
//    cache, on every implementation, and a cache written by any reshape_and_cache implementation is
//    read by every paged_attention implementation.
#include <functional>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;

// ---------------------------------------------------------------------------------------------
// The packed layout by its definition: element offsets inside one (block, head) region.

/// K: rows of 16 tokens x a pair of dims.
int64_t packed_k_index(int64_t t, int64_t d, int64_t head_size) {
    return (t / 16) * 16 * head_size + (d / 2) * 32 + (t % 16) * 2 + d % 2;
}
/// V: rows of 16 dims x a pair of tokens.
int64_t packed_v_index(int64_t t, int64_t d, int64_t block_size) {
    return (d / 16) * 16 * block_size + (t / 2) * 32 + (d % 16) * 2 + t % 2;
}

/// How the caller lays out the (block, head) regions of a packed cache.
enum class region_layout {
    dense,     ///< [num_blocks, Hkv] regions back to back, one allocation per cache
    kv_shared, ///< K and V of a block side by side in one allocation: block stride 2 * Hkv * BS * D
    padded,    ///< 64 bytes of padding after each head region and 128 after each block
};
const char *kind_name(region_layout l) {
    return l == region_layout::dense ? "dense" : l == region_layout::kv_shared ? "kvshared" : "padded";
}

struct packed_cache {
    format fmt = format::f32;
    int64_t num_blocks = 0, kv_heads = 0, block_size = 0, head_size = 0;
    region_layout kind = region_layout::dense;
    int64_t block_stride = 0, head_stride = 0, v_offset = 0; // elements
    buffer k_mem, v_mem;                                     // v_mem unused for kv_shared

    void *k() { return k_mem.data(); }
    void *v() {
        return kind == region_layout::kv_shared ? k_mem.data() + v_offset * size_of(fmt) : v_mem.data();
    }
    const void *k() const { return const_cast<packed_cache *>(this)->k(); }
    const void *v() const { return const_cast<packed_cache *>(this)->v(); }
    pa::tensor_desc md() const {
        return pa::tensor_desc({ num_blocks, kv_heads, block_size, head_size }, dt_of(fmt),
                               { block_stride, head_stride, head_size, 1 }, pa::layout::packed);
    }
    /// Element offset of (b, h, t, d) from k() / v().
    int64_t k_at(int64_t b, int64_t h, int64_t t, int64_t d) const {
        return b * block_stride + h * head_stride + packed_k_index(t, d, head_size);
    }
    int64_t v_at(int64_t b, int64_t h, int64_t t, int64_t d) const {
        return b * block_stride + h * head_stride + packed_v_index(t, d, block_size);
    }
};

packed_cache make_packed(format f, int64_t nb, int64_t hkv, int64_t bs, int64_t d, region_layout kind) {
    packed_cache c;
    c.fmt = f;
    c.num_blocks = nb;
    c.kv_heads = hkv;
    c.block_size = bs;
    c.head_size = d;
    c.kind = kind;
    const int64_t region = bs * d, es = size_of(f);
    switch (kind) {
        case region_layout::dense:
            c.head_stride = region;
            c.block_stride = hkv * region;
            break;
        case region_layout::kv_shared:
            c.head_stride = region;
            c.block_stride = 2 * hkv * region;
            c.v_offset = hkv * region;
            break;
        case region_layout::padded:
            c.head_stride = region + 64 / es;
            c.block_stride = hkv * c.head_stride + 128 / es;
            break;
    }
    const auto bytes = static_cast<size_t>(nb * c.block_stride * es);
    c.k_mem = buffer(bytes);
    if (kind != region_layout::kv_shared) c.v_mem = buffer(bytes);
    return c;
}

// ---------------------------------------------------------------------------------------------
// Writing a cache with reshape_and_cache

/// The new tokens of one reshape_and_cache call: f32 values (exact in in_fmt), stored in in_fmt.
struct new_tokens {
    format in_fmt = format::f32;
    int64_t tokens = 0, kv_heads = 0, head_size = 0;
    std::vector<float> k_in, v_in; // [T, Hkv, D]
    buffer key, value;
    std::vector<int64_t> slots;

    pa::tensor_desc md() const { return pa::tensor_desc({ tokens, kv_heads, head_size }, dt_of(in_fmt)); }
    void store() {
        key = buffer(k_in.size() * static_cast<size_t>(size_of(in_fmt)));
        value = buffer(key.size());
        for (size_t i = 0; i < k_in.size(); ++i) {
            store_exact(key.data(), in_fmt, static_cast<int64_t>(i), k_in[i]);
            store_exact(value.data(), in_fmt, static_cast<int64_t>(i), v_in[i]);
        }
    }
};

pa::reshape_and_cache::desc reshape_desc(format in_fmt, int64_t hkv, int64_t d,
                                         const pa::tensor_desc &cache) {
    const pa::tensor_desc kv_md({ pa::runtime_dim, hkv, d }, dt_of(in_fmt));
    return pa::reshape_and_cache::desc(kv_md, kv_md, cache, cache);
}

/// Runs a reshape_and_cache primitive; per-token scale tensors are written in ks / vs.
void run_reshape(const pa::reshape_and_cache::primitive_desc &pd, const new_tokens &in, void *k_cache,
                 void *v_cache, scales_spec &ks, scales_spec &vs, int64_t num_blocks, int64_t block_size) {
    pa::reshape_and_cache prim(pd);
    pa::exec_args a {
        { pa::ARG_KEY, pa::tensor(in.md(), in.key.data()) },
        { pa::ARG_VALUE, pa::tensor(in.md(), in.value.data()) },
        { pa::ARG_K_CACHE, pa::tensor(pd.query_md(pa::ARG_K_CACHE), k_cache) },
        { pa::ARG_V_CACHE, pa::tensor(pd.query_md(pa::ARG_V_CACHE), v_cache) },
        { pa::ARG_SLOT_MAPPING,
          pa::tensor(pa::tensor_desc({ in.tokens }, pa::data_type::s64), in.slots.data()) },
    };
    if (ks.kind != scales::none)
        a[pa::ARG_K_SCALES] = pa::tensor(ks.md(num_blocks, in.kv_heads, block_size), ks.values.data());
    if (vs.kind != scales::none)
        a[pa::ARG_V_SCALES] = pa::tensor(vs.md(num_blocks, in.kv_heads, block_size), vs.values.data());
    dnnl::stream st = make_stream();
    prim.execute(st, a);
    st.wait();
}

pa::primitive_attr scales_attr(scales k, scales v) {
    pa::primitive_attr a;
    if (k != scales::none) a.set_scales_mask(pa::ARG_K_CACHE, scales_mask(k));
    if (v != scales::none) a.set_scales_mask(pa::ARG_V_CACHE, scales_mask(v));
    return a;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Element-by-element comparison of a packed cache with a plain one holding the same tokens: each
/// (b, h, t, d) element's bytes at the packed position equal the plain cache's; every byte of the
/// packed allocation that no element maps to still holds the 0xFF fill. Returns the mismatches.
int64_t compare_packed_with_plain(const packed_cache &p, const kv_cache &plain, bool is_k) {
    const int64_t es = size_of(p.fmt);
    const auto *pk = static_cast<const unsigned char *>(is_k ? p.k() : p.v());
    const auto *pl = static_cast<const unsigned char *>(is_k ? plain.k() : plain.v());
    const size_t alloc = p.k_mem.size(); // v_mem has the same size
    const auto *alloc_base = is_k || p.kind == region_layout::kv_shared ? p.k_mem.data() : p.v_mem.data();
    std::vector<bool> mapped(alloc, false);
    const auto base_off = static_cast<size_t>(pk - alloc_base);
    int64_t bad = 0;
    for (int64_t b = 0; b < p.num_blocks; ++b)
        for (int64_t h = 0; h < p.kv_heads; ++h)
            for (int64_t t = 0; t < p.block_size; ++t)
                for (int64_t d = 0; d < p.head_size; ++d) {
                    const int64_t at = is_k ? p.k_at(b, h, t, d) : p.v_at(b, h, t, d);
                    const int64_t want = plain.offset(b, h, t) + d;
                    for (int64_t i = 0; i < es; ++i) {
                        const size_t byte = base_off + static_cast<size_t>(at * es + i);
                        if (mapped[byte]) {
                            ADD_FAILURE() << "index math maps two elements to byte " << byte;
                            return 1;
                        }
                        mapped[byte] = true;
                    }
                    if (std::memcmp(pk + at * es, pl + want * es, static_cast<size_t>(es)) != 0 && bad++ < 4)
                        ADD_FAILURE() << (is_k ? "K" : "V") << " element (block " << b << ", head " << h
                                      << ", t " << t << ", d " << d << ") at packed offset " << at << ": got "
                                      << reference::load(pk, p.fmt, at) << ", plain cache has "
                                      << reference::load(pl, p.fmt, want);
                }
    // Bytes of this cache's allocation that belong to no element of it (padding; for kv_shared the
    // other cache's bytes are checked by the other call).
    if (p.kind != region_layout::kv_shared) {
        int64_t touched = 0;
        for (size_t i = 0; i < alloc; ++i)
            if (!mapped[i] && alloc_base[i] != 0xFF) ++touched;
        EXPECT_EQ(touched, 0) << (is_k ? "K" : "V") << ": bytes outside every element were written";
    }
    return bad;
}

// ---------------------------------------------------------------------------------------------
// layout::any

TEST(packed_layout, index_math_is_a_bijection_of_the_region) {
    // A check of the test's own definition: both orders cover [0, BS * D) exactly once.
    for (int64_t bs : { 16, 32, 48 })
        for (int64_t d : { 16, 48, 80 }) {
            std::vector<int> k(static_cast<size_t>(bs * d), 0), v(k.size(), 0);
            for (int64_t t = 0; t < bs; ++t)
                for (int64_t e = 0; e < d; ++e) {
                    ++k.at(static_cast<size_t>(packed_k_index(t, e, d)));
                    ++v.at(static_cast<size_t>(packed_v_index(t, e, bs)));
                }
            EXPECT_EQ(std::count(k.begin(), k.end(), 1), bs * d) << bs << "x" << d;
            EXPECT_EQ(std::count(v.begin(), v.end(), 1), bs * d) << bs << "x" << d;
        }
}

TEST(packed_layout, any_resolves_from_dims_and_type_alone) {
    const pa::data_type types[] = { pa::data_type::f32, pa::data_type::bf16, pa::data_type::f16,
                                    pa::data_type::f8_e4m3, pa::data_type::f8_e5m2 };
    struct shape {
        int64_t nb, hkv, bs, d;
    };
    const shape shapes[] = { { 5, 2, 16, 64 },   { 3, 1, 32, 16 }, { 4, 3, 48, 80 },  { 2, 2, 16, 512 },
                             { 7, 2, 128, 128 }, { 5, 2, 8, 64 },  { 5, 2, 16, 24 },  { 3, 1, 1, 16 },
                             { 3, 4, 24, 32 },   { 3, 2, 16, 8 },  { 2, 1, 13, 100 }, { 2, 2, 32, 1 } };
    const pa::cpu_isa caps[] = { pa::cpu_isa::all, pa::cpu_isa::avx2, pa::cpu_isa::generic };
    for (pa::data_type dt : types)
        for (const shape &sh : shapes) {
            SCOPED_TRACE(std::string(pa::data_type_name(dt)) + " nb" + std::to_string(sh.nb) + " hkv" +
                         std::to_string(sh.hkv) + " bs" + std::to_string(sh.bs) + " d" +
                         std::to_string(sh.d));
            const bool packable = sh.bs % 16 == 0 && sh.d % 16 == 0;
            const pa::dims dims { sh.nb, sh.hkv, sh.bs, sh.d };
            const pa::dims dense { sh.hkv * sh.bs * sh.d, sh.bs * sh.d, sh.d, 1 };
            const pa::tensor_desc any(dims, dt, pa::layout::any);
            const pa::tensor_desc q({ pa::runtime_dim, 2 * sh.hkv, sh.d }, pa::data_type::bf16);
            const pa::tensor_desc kv({ pa::runtime_dim, sh.hkv, sh.d }, pa::data_type::bf16);
            for (pa::cpu_isa cap : caps) {
                pa::primitive_attr attr;
                attr.set_max_cpu_isa(cap);
                pa::paged_attention::primitive_desc apd(engine(), pa::paged_attention::desc(q, any, any, q),
                                                        attr);
                pa::reshape_and_cache::primitive_desc rpd(
                        engine(), pa::reshape_and_cache::desc(kv, kv, any, any), attr);
                // Every implementation of either walk reports the same resolution.
                do {
                    do {
                        SCOPED_TRACE(std::string("cap ") + pa::cpu_isa_name(cap) + ", " +
                                     apd.impl_info_str() + " / " + rpd.impl_info_str());
                        for (int arg : { pa::ARG_K_CACHE, pa::ARG_V_CACHE }) {
                            const pa::tensor_desc md = apd.query_md(arg);
                            EXPECT_EQ(md.get_layout(), packable ? pa::layout::packed : pa::layout::plain);
                            EXPECT_EQ(md.get_dims(), dims);
                            EXPECT_EQ(md.get_strides(), dense);
                            EXPECT_EQ(md.get_data_type(), dt);
                            EXPECT_EQ(md.get_size(), static_cast<size_t>(sh.nb * sh.hkv * sh.bs * sh.d) *
                                                             pa::data_type_size(dt));
                            EXPECT_TRUE(rpd.query_md(arg) == md)
                                    << "reshape_and_cache resolves " << rpd.query_md(arg).str()
                                    << ", paged_attention " << md.str();
                        }
                    } while (rpd.next_impl());
                } while (apd.next_impl());
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Caller-set strides: accepted and rejected descriptors

TEST(packed_layout, caller_strides_are_accepted_and_kept) {
    for (format f : { format::f32, format::bf16, format::f16, format::e4m3, format::e5m2 })
        for (region_layout kind : { region_layout::dense, region_layout::kv_shared, region_layout::padded }) {
            SCOPED_TRACE(std::string(name_of(f)) + " " + kind_name(kind));
            const packed_cache c = make_packed(f, 3, 2, 32, 48, kind);
            const pa::tensor_desc md = c.md();
            const pa::tensor_desc q({ pa::runtime_dim, 4, 48 }, pa::data_type::f32);
            const pa::tensor_desc kv({ pa::runtime_dim, 2, 48 }, pa::data_type::f32);
            pa::paged_attention::primitive_desc apd(engine(), pa::paged_attention::desc(q, md, md, q));
            pa::reshape_and_cache::primitive_desc rpd(engine(), pa::reshape_and_cache::desc(kv, kv, md, md));
            do {
                for (int arg : { pa::ARG_K_CACHE, pa::ARG_V_CACHE }) {
                    EXPECT_TRUE(apd.query_md(arg) == md)
                            << apd.impl_info_str() << ": " << apd.query_md(arg).str();
                    EXPECT_EQ(apd.query_md(arg).get_layout(), pa::layout::packed);
                }
            } while (apd.next_impl());
            do {
                for (int arg : { pa::ARG_K_CACHE, pa::ARG_V_CACHE })
                    EXPECT_TRUE(rpd.query_md(arg) == md)
                            << rpd.impl_info_str() << ": " << rpd.query_md(arg).str();
            } while (rpd.next_impl());
        }
}

struct bad_packed {
    std::string why;
    pa::data_type dt;
    pa::dims dims, strides;
};

std::vector<bad_packed> bad_packed_descs() {
    using dt = pa::data_type;
    std::vector<bad_packed> v;
    // Block size / head size not multiples of 16 (dense strides otherwise).
    v.push_back({ "block_size_8", dt::bf16, { 4, 2, 8, 64 }, { 2 * 8 * 64, 8 * 64, 64, 1 } });
    v.push_back({ "block_size_24", dt::f8_e4m3, { 4, 2, 24, 64 }, { 2 * 24 * 64, 24 * 64, 64, 1 } });
    v.push_back({ "head_size_24", dt::f32, { 4, 2, 16, 24 }, { 2 * 16 * 24, 16 * 24, 24, 1 } });
    v.push_back({ "head_size_8", dt::f8_e5m2, { 4, 2, 32, 8 }, { 2 * 32 * 8, 32 * 8, 8, 1 } });
    // Head / block strides that are not multiples of 64 bytes.
    v.push_back({ "head_stride_f32_plus_1", dt::f32, { 4, 2, 16, 16 }, { 2 * 257, 257, 16, 1 } });
    v.push_back({ "head_stride_e4m3_plus_32B", dt::f8_e4m3, { 4, 2, 16, 16 }, { 2 * 288, 288, 16, 1 } });
    v.push_back({ "head_stride_bf16_plus_16B", dt::bf16, { 4, 3, 16, 32 }, { 3 * 520, 520, 32, 1 } });
    v.push_back({ "block_stride_bf16_plus_32B", dt::bf16, { 4, 2, 16, 32 }, { 2 * 512 + 16, 512, 32, 1 } });
    // Token and dim strides other than D and 1.
    v.push_back({ "token_stride_2D", dt::bf16, { 4, 2, 16, 32 }, { 2 * 1024, 1024, 64, 1 } });
    v.push_back({ "token_stride_NHD", dt::f8_e4m3, { 4, 2, 16, 64 }, { 2 * 16 * 64, 64, 2 * 64, 1 } });
    v.push_back({ "dim_stride_2", dt::f32, { 4, 2, 16, 32 }, { 2 * 1024, 1024, 32, 2 } });
    v.push_back({ "dim_stride_0", dt::f16, { 4, 2, 16, 32 }, { 2 * 512, 512, 32, 0 } });
    return v;
}

TEST(packed_layout, bad_packed_descs_are_rejected) {
    for (const bad_packed &b : bad_packed_descs()) {
        SCOPED_TRACE(b.why);
        const int64_t hkv = b.dims[1], d = b.dims[3];
        const pa::tensor_desc good(b.dims, b.dt, pa::layout::any);
        const pa::tensor_desc q({ pa::runtime_dim, 2 * hkv, d }, pa::data_type::bf16);
        const pa::tensor_desc kv({ pa::runtime_dim, hkv, d }, pa::data_type::bf16);
        // The bad desc as K (with a good V) and as V (with a good K), for both primitives.
        for (int which = 0; which < 2; ++which) {
            const char *arg = which == 0 ? "k_cache" : "v_cache";
            const auto check = [&](const char *primitive, const std::function<void()> &make) {
                try {
                    make();
                    ADD_FAILURE() << primitive << " accepted a bad packed " << arg;
                } catch (const pa::error &e) {
                    EXPECT_EQ(e.get_status(), pa::status::invalid_arguments) << e.what();
                    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos)
                            << "the message should name " << arg << ": " << e.what();
                }
            };
            check("paged_attention", [&] {
                const pa::tensor_desc bad(b.dims, b.dt, b.strides, pa::layout::packed);
                const pa::tensor_desc &k = which == 0 ? bad : good, &v = which == 0 ? good : bad;
                pa::paged_attention::primitive_desc pd(engine(), pa::paged_attention::desc(q, k, v, q));
            });
            check("reshape_and_cache", [&] {
                const pa::tensor_desc bad(b.dims, b.dt, b.strides, pa::layout::packed);
                const pa::tensor_desc &k = which == 0 ? bad : good, &v = which == 0 ? good : bad;
                pa::reshape_and_cache::primitive_desc pd(engine(), pa::reshape_and_cache::desc(kv, kv, k, v));
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The bytes reshape_and_cache writes

struct bytes_case {
    format cache = format::f32, in = format::f32;
    int64_t hkv = 2, bs = 16, d = 32;
    region_layout kind = region_layout::dense;
    scales ks = scales::none, vs = scales::none;
    float a = 1.f, b = 1.f; // per-tensor / per-head values
    std::string name() const {
        std::ostringstream os;
        os << name_of(cache) << "_from_" << name_of(in) << "_h" << hkv << "_bs" << bs << "_d" << d << "_"
           << kind_name(kind) << "_k" << name_of(ks) << "_v" << name_of(vs);
        return os.str();
    }
};
void PrintTo(const bytes_case &c, std::ostream *os) {
    *os << c.name();
}

std::vector<bytes_case> bytes_cases() {
    const auto none = scales::none, tensor = scales::per_tensor, head = scales::per_kv_head,
               token = scales::per_token;
    using rl = region_layout;
    std::vector<bytes_case> v;
    v.push_back({ format::f32, format::f32, 2, 16, 32, rl::dense, none, none });
    v.push_back({ format::f32, format::bf16, 1, 48, 16, rl::padded, none, none });
    v.push_back({ format::bf16, format::f16, 3, 32, 48, rl::kv_shared, none, none });
    v.push_back({ format::bf16, format::f32, 2, 16, 128, rl::padded, none, none });
    v.push_back({ format::f16, format::bf16, 2, 16, 80, rl::padded, none, none });
    v.push_back({ format::f16, format::f32, 1, 64, 32, rl::dense, none, none });
    for (format f : { format::e4m3, format::e5m2 }) {
        v.push_back({ f, format::f32, 2, 16, 64, rl::dense, none, none });
        v.push_back({ f, format::bf16, 2, 32, 48, rl::kv_shared, tensor, tensor, 0.037f, 5.3f });
        v.push_back({ f, format::f16, 3, 16, 80, rl::padded, head, token, 5.3f, 0.037f });
        v.push_back({ f, format::f32, 2, 48, 32, rl::dense, token, token });
        v.push_back({ f, format::bf16, 1, 16, 256, rl::kv_shared, token, head, 0.037f, 5.3f });
        v.push_back({ f, format::f32, 2, 32, 16, rl::padded, tensor, head, 5.3f, 0.037f });
    }
    return v;
}

class packed_bytes : public ::testing::TestWithParam<bytes_case> {};

// The same tokens written to a plain (HND) cache by the reference and to a packed cache by every
// reshape_and_cache implementation: every element at its defined packed position holds the plain
// cache's bytes, which hold the format's own encoding of the input; the per-token scales agree.
TEST_P(packed_bytes, elements_sit_at_their_defined_positions) {
    const bytes_case &c = GetParam();
    rng r(seed_of(c.name()));
    const int64_t nb = 6;
    new_tokens in;
    in.in_fmt = c.in;
    in.kv_heads = c.hkv;
    in.head_size = c.d;
    // Most slots written, a few left unwritten, two tokens skipped (negative slot).
    std::vector<int64_t> perm(static_cast<size_t>(nb * c.bs));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), r.engine());
    perm.resize(perm.size() - 5);
    perm.insert(perm.begin() + 3, -1);
    perm.push_back(-7);
    in.slots = perm;
    in.tokens = static_cast<int64_t>(perm.size());
    in.k_in.resize(static_cast<size_t>(in.tokens * c.hkv * c.d));
    in.v_in.resize(in.k_in.size());
    for (auto &x : in.k_in)
        x = r.coarse_normal();
    for (auto &x : in.v_in)
        x = r.coarse_normal();
    add_outliers(in.k_in, 5, r); // saturate under a per-tensor scale of 0.037
    add_outliers(in.v_in, 5, r);
    in.store();

    // Plain cache, written by the reference.
    kv_cache plain = make_cache(c.cache, nb, c.hkv, c.bs, c.d, cache_layout::hnd);
    scales_spec pks = make_scales(c.ks, c.a, c.b, nb, c.hkv, c.bs),
                pvs = make_scales(c.vs, c.b, c.a, nb, c.hkv, c.bs);
    pa::primitive_attr ref_attr = scales_attr(c.ks, c.vs);
    ref_attr.set_max_cpu_isa(pa::cpu_isa::generic);
    pa::reshape_and_cache::primitive_desc ref_pd(engine(), reshape_desc(c.in, c.hkv, c.d, plain.md()),
                                                 ref_attr);
    ASSERT_STREQ(ref_pd.impl_info_str(), "ref:any");
    run_reshape(ref_pd, in, plain.k(), plain.v(), pks, pvs, nb, c.bs);

    // The plain cache holds the format's encoding of every written token (independent encoders).
    int64_t wrong = 0, written = 0;
    for (int64_t i = 0; i < in.tokens; ++i) {
        const int64_t slot = in.slots[static_cast<size_t>(i)];
        if (slot < 0) continue;
        const int64_t blk = slot / c.bs, t = slot % c.bs;
        for (int64_t h = 0; h < c.hkv; ++h)
            for (int is_k = 0; is_k < 2; ++is_k) {
                const std::vector<float> &src = is_k ? in.k_in : in.v_in;
                const scales_spec &sp = is_k ? pks : pvs;
                const float *row = &src[static_cast<size_t>((i * c.hkv + h) * c.d)];
                const float scale = !is_fp8(c.cache) ? 1.f
                                    : sp.kind == scales::per_token
                                            ? expected_token_scale(row, c.d, c.cache)
                                            : static_cast<float>(sp.at(blk, h, t, c.hkv, c.bs));
                if (sp.kind == scales::per_token &&
                    std::memcmp(&sp.values[static_cast<size_t>((blk * c.hkv + h) * c.bs + t)], &scale, 4) !=
                            0 &&
                    wrong++ < 4)
                    ADD_FAILURE() << "per-token scale of slot " << slot << " head " << h;
                const auto *stored = static_cast<const unsigned char *>(is_k ? plain.k() : plain.v()) +
                                     (plain.offset(blk, h, t)) * size_of(c.cache);
                for (int64_t e = 0; e < c.d; ++e) {
                    unsigned char want[4];
                    if (is_fp8(c.cache))
                        want[0] = reference::encode_fp8_slow(c.cache, static_cast<double>(row[e] / scale));
                    else if (c.cache == format::f32)
                        std::memcpy(want, &row[e], 4);
                    else {
                        const uint16_t h16 = c.cache == format::bf16 ? reference::double_to_bf16(row[e])
                                                                     : reference::double_to_f16(row[e]);
                        std::memcpy(want, &h16, 2);
                    }
                    ++written;
                    if (std::memcmp(stored + e * size_of(c.cache), want,
                                    static_cast<size_t>(size_of(c.cache))) != 0 &&
                        wrong++ < 4)
                        ADD_FAILURE() << (is_k ? "K" : "V") << " of token " << i << " head " << h << " dim "
                                      << e << " in the plain cache is not the encoding of " << row[e];
                }
            }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(written, 0);

    // Packed caches, written by every implementation.
    packed_cache probe = make_packed(c.cache, nb, c.hkv, c.bs, c.d, c.kind);
    pa::reshape_and_cache::primitive_desc pd(engine(), reshape_desc(c.in, c.hkv, c.d, probe.md()),
                                             scales_attr(c.ks, c.vs));
    int impls = 0;
    do {
        ++impls;
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        packed_cache packed = make_packed(c.cache, nb, c.hkv, c.bs, c.d, c.kind);
        scales_spec ks = make_scales(c.ks, c.a, c.b, nb, c.hkv, c.bs),
                    vs = make_scales(c.vs, c.b, c.a, nb, c.hkv, c.bs);
        run_reshape(pd, in, packed.k(), packed.v(), ks, vs, nb, c.bs);
        EXPECT_EQ(compare_packed_with_plain(packed, plain, true), 0);
        EXPECT_EQ(compare_packed_with_plain(packed, plain, false), 0);
        if (c.kind == region_layout::kv_shared) {
            // K and V together fill the shared allocation: nothing else in it.
            int64_t touched = 0;
            const int64_t es = size_of(c.cache);
            std::vector<bool> mapped(packed.k_mem.size(), false);
            for (int64_t b = 0; b < nb; ++b)
                for (int64_t h = 0; h < c.hkv; ++h)
                    for (int64_t t = 0; t < c.bs; ++t)
                        for (int64_t e = 0; e < c.d; ++e)
                            for (int64_t i = 0; i < es; ++i) {
                                mapped[static_cast<size_t>(packed.k_at(b, h, t, e) * es + i)] = true;
                                mapped[static_cast<size_t>((packed.v_offset + packed.v_at(b, h, t, e)) * es +
                                                           i)] = true;
                            }
            for (size_t i = 0; i < mapped.size(); ++i)
                if (!mapped[i] && packed.k_mem.data()[i] != 0xFF) ++touched;
            EXPECT_EQ(touched, 0);
        }
        EXPECT_TRUE(same_bits(ks.values, pks.values)) << "K scales differ from the plain cache's";
        EXPECT_TRUE(same_bits(vs.values, pvs.values)) << "V scales differ from the plain cache's";
    } while (pd.next_impl());
    RecordProperty("implementations", std::to_string(impls));
}

INSTANTIATE_TEST_SUITE_P(types_and_scales, packed_bytes, ::testing::ValuesIn(bytes_cases()),
                         [](const ::testing::TestParamInfo<bytes_case> &i) { return i.param.name(); });

// ---------------------------------------------------------------------------------------------
// Attention on a packed cache

/// The setup's context tokens written to a packed cache by `pd` (same slots as the plain cache).
void fill_packed(const attn_setup &s, const pa::reshape_and_cache::primitive_desc &pd, packed_cache &pc,
                 scales_spec &ks, scales_spec &vs) {
    const attn_case &c = s.c;
    new_tokens in;
    in.in_fmt = c.q_fmt;
    in.kv_heads = c.hkv;
    in.head_size = c.d;
    in.tokens = s.b.context_tokens;
    in.k_in = s.k_in;
    in.v_in = s.v_in;
    for (int64_t q = 0; q < s.b.num_seqs; ++q)
        for (int64_t j = 0; j < s.b.seq_lens[static_cast<size_t>(q)]; ++j)
            in.slots.push_back(s.b.slot_of(q, j));
    in.store();
    ks = make_scales(c.k_scales, c.scale_a, c.scale_b, s.b.num_blocks, c.hkv, c.bs);
    vs = make_scales(c.v_scales, c.scale_b, c.scale_a, s.b.num_blocks, c.hkv, c.bs);
    run_reshape(pd, in, pc.k(), pc.v(), ks, vs, s.b.num_blocks, c.bs);
}

pa::reshape_and_cache::primitive_desc packed_writer(const attn_setup &s, const packed_cache &pc) {
    return pa::reshape_and_cache::primitive_desc(engine(), reshape_desc(s.c.q_fmt, s.c.hkv, s.c.d, pc.md()),
                                                 s.attr());
}

pa::paged_attention::primitive_desc packed_reader(const attn_setup &s, const packed_cache &pc) {
    const pa::tensor_desc qmd({ pa::runtime_dim, s.c.hq, s.c.d }, dt_of(s.c.q_fmt));
    const pa::tensor_desc dmd({ pa::runtime_dim, s.c.hq, s.c.d }, dt_of(s.c.dst_fmt));
    return pa::paged_attention::primitive_desc(
            engine(), pa::paged_attention::desc(qmd, pc.md(), pc.md(), dmd, s.opts), s.attr());
}

/// The setup's arguments with the packed caches (and their scales) in place of the plain ones.
pa::exec_args packed_args(const attn_setup &s, const packed_cache &pc, const scales_spec &ks,
                          const scales_spec &vs, void *dst) {
    const attn_case &c = s.c;
    pa::exec_args a = s.args(s.q.data(), dst);
    a[pa::ARG_K_CACHE] = pa::tensor(pc.md(), pc.k());
    a[pa::ARG_V_CACHE] = pa::tensor(pc.md(), pc.v());
    if (ks.kind != scales::none)
        a[pa::ARG_K_SCALES] = pa::tensor(ks.md(s.b.num_blocks, c.hkv, c.bs), ks.values.data());
    if (vs.kind != scales::none)
        a[pa::ARG_V_SCALES] = pa::tensor(vs.md(s.b.num_blocks, c.hkv, c.bs), vs.values.data());
    return a;
}

/// Runs every paged_attention implementation that accepts the packed cache and compares with the
/// oracle on the plain cache. Returns the implementations visited.
std::vector<std::string> attend_every_impl(const attn_setup &s, const packed_cache &pc, const scales_spec &ks,
                                           const scales_spec &vs, const oracle::result &ref) {
    const attn_case &c = s.c;
    pa::paged_attention::primitive_desc pd = packed_reader(s, pc);
    EXPECT_TRUE(pd.query_md(pa::ARG_K_CACHE) == pc.md()) << pd.query_md(pa::ARG_K_CACHE).str();
    std::vector<std::string> names;
    dnnl::stream st = make_stream();
    do {
        names.push_back(pd.impl_info_str());
        SCOPED_TRACE(std::string("paged_attention impl ") + pd.impl_info_str());
        pa::paged_attention prim(pd);
        buffer dst = s.make_dst();
        prim.execute(st, packed_args(s, pc, ks, vs, dst.data()));
        st.wait();
        const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
        EXPECT_EQ(cmp.failures, 0) << "packed cache against the oracle on the plain cache: " << cmp;
        EXPECT_EQ(cmp.checked, s.b.tokens * c.hq * c.d);
    } while (pd.next_impl());
    return names;
}

struct packed_attn_case {
    attn_case c;
    region_layout kind;
};
void PrintTo(const packed_attn_case &p, std::ostream *os) {
    *os << p.c.name() << "_" << kind_name(p.kind);
}

std::vector<packed_attn_case> attn_cases() {
    const auto f32 = format::f32, bf16 = format::bf16, f16 = format::f16, e4m3 = format::e4m3,
               e5m2 = format::e5m2;
    const auto hnd = cache_layout::hnd;
    const auto tensor = scales::per_tensor, head = scales::per_kv_head, token = scales::per_token;
    const bool red = reduced();
    using rl = region_layout;
    std::vector<packed_attn_case> v;
    // Decode, GQA, FP8 with per-token scales.
    v.push_back({ make_case("decode", 8, 2, 64, 16, { { 1, 213 }, { 1, 312 }, { 1, 7 } }, bf16, e4m3, hnd)
                          .scales(token, token),
                  rl::dense });
    // Decode with GQA 6: 6 rows per item, in passes of 4 and 2 rows (x64:avx512 scores FP8 keys
    // against q's half-broadcasts, which each pass must take from its own rows).
    v.push_back({ make_case("decode_gqa6", 12, 2, 64, 16, { { 1, 300 }, { 1, 45 } }, bf16, e4m3, hnd)
                          .scales(token, token),
                  rl::dense });
    // Prefill, f32 cache, ALiBi.
    v.push_back({ make_case("prefill", 4, 4, 128, 32, { { 5, 5 }, { 37, 100 } }, f32, f32, hnd).with_alibi(),
                  rl::padded });
    // Mixed prefill/decode, MQA, e5m2 with per-tensor K and per-head V scales, sinks, window.
    v.push_back({ make_case("mixed", 8, 1, 80, 16,
                            { { 40, 300 }, { 1, 1000 }, { 17, 17 }, { 1, 33 }, { 0, 20 } }, f16, e5m2, hnd)
                          .scales(tensor, head, 0.037f, 5.3f)
                          .with_sinks()
                          .window(255, 0),
                  rl::kv_shared });
    // Mixed with long sequences, bf16 cache, soft-cap.
    v.push_back({ make_case("mixed_long", 16, 2, 128, 64,
                            red ? std::vector<std::pair<int, int>> { { 20, 600 }, { 1, 1500 }, { 1, 70 } }
                                : std::vector<std::pair<int, int>> { { 60, 1145 }, { 1, 4162 }, { 1, 70 } },
                            bf16, bf16, hnd)
                          .cap(50.f),
                  rl::kv_shared });
    // Head size 256, e4m3 per-token K and per-head V, f32 query.
    v.push_back({ make_case("d256", 4, 1, 256, 16, { { 1, 500 }, { 3, 16 } }, f32, e4m3, hnd)
                          .scales(token, head, 5.3f, 0.037f),
                  rl::dense });
    // f16 cache, non-causal two-sided window, f16 query with f32 dst.
    v.push_back({ make_case("window", 6, 3, 32, 48, { { 9, 90 }, { 1, 49 } }, f16, f16, hnd)
                          .non_causal()
                          .window(31, 17)
                          .dst(f32),
                  rl::padded });
    // Head size 512, e4m3 per-token, prefill and decode.
    v.push_back({ make_case("d512", 2, 1, 512, 16, { { 1, 100 }, { 2, 40 } }, bf16, e4m3, hnd)
                          .scales(token, token),
                  rl::kv_shared });
    // Speculative verify: q_len 2 to 4 with GQA 4, 8 to 16 rows per item (their own score passes
    // on x64:avx512_bf16), with a bf16 dst; bf16 and e4m3 caches, chunks of whole and partial blocks.
    v.push_back({ make_case("verify", 8, 2, 128, 128, { { 4, 700 }, { 3, 300 }, { 2, 129 }, { 4, 4 } }, bf16,
                            bf16, hnd),
                  rl::dense });
    v.push_back({ make_case("verify", 8, 2, 64, 16, { { 4, 333 }, { 3, 90 }, { 2, 17 } }, bf16, e4m3, hnd)
                          .scales(token, token),
                  rl::padded });
    // Verify under a sliding window whose left edge starts the item's range at token 14 of a
    // 16-token group (its 8th pair, odd): FP8 values staged for 16 rows from an odd first pair,
    // with 16-token blocks, so the next pair lies in another block.
    v.push_back({ make_case("verify_window", 8, 2, 64, 16, { { 4, 333 }, { 3, 90 } }, bf16, e4m3, hnd)
                          .scales(token, token)
                          .window(11, 0),
                  rl::dense });
    // e5m2 per-token, prefill chunk.
    v.push_back({ make_case("chunk", 4, 2, 64, 32, { { 33, 250 } }, f32, e5m2, hnd).scales(token, token),
                  rl::dense });
    return v;
}

class packed_attention : public ::testing::TestWithParam<packed_attn_case> {};

TEST_P(packed_attention, matches_oracle_on_every_implementation) {
    const packed_attn_case &pc_case = GetParam();
    const attn_setup s = build_setup(pc_case.c); // the plain cache and the oracle's truth
    const oracle::result ref = s.oracle_on_cache();
    const attn_case &c = s.c;

    packed_cache pc = make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, pc_case.kind);
    scales_spec ks, vs;
    fill_packed(s, packed_writer(s, pc), pc, ks, vs);
    // The packed cache holds the plain cache's values (so the oracle on the plain cache is the truth).
    EXPECT_EQ(compare_packed_with_plain(pc, s.cache, true), 0);
    EXPECT_EQ(compare_packed_with_plain(pc, s.cache, false), 0);
    EXPECT_TRUE(same_bits(ks.values, s.ks.values));
    EXPECT_TRUE(same_bits(vs.values, s.vs.values));

    const std::vector<std::string> names = attend_every_impl(s, pc, ks, vs, ref);
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names.back(), "ref:any") << "the reference reads the packed layout";
    std::string all;
    for (const auto &n : names)
        all += n + " ";
    RecordProperty("implementations", all);
}

INSTANTIATE_TEST_SUITE_P(batches, packed_attention, ::testing::ValuesIn(attn_cases()),
                         [](const ::testing::TestParamInfo<packed_attn_case> &i) {
                             return i.param.c.name() + "_" + kind_name(i.param.kind);
                         });

// ---------------------------------------------------------------------------------------------
// Every writer x every reader

TEST(packed_layout, every_writer_is_read_by_every_reader) {
    const bool red = reduced();
    std::vector<attn_case> cases;
    cases.push_back(make_case("cross_e4m3", 8, 2, 64, 16,
                              red ? std::vector<std::pair<int, int>> { { 12, 200 }, { 1, 700 }, { 1, 5 } }
                                  : std::vector<std::pair<int, int>> { { 40, 600 }, { 1, 1500 }, { 1, 5 } },
                              format::bf16, format::e4m3, cache_layout::hnd)
                            .scales(scales::per_token, scales::per_token));
    cases.push_back(make_case("cross_bf16", 4, 4, 96, 32, { { 7, 130 }, { 1, 400 } }, format::f16,
                              format::bf16, cache_layout::hnd)
                            .with_sinks());
    cases.push_back(make_case("cross_e5m2", 4, 1, 32, 16, { { 3, 77 }, { 1, 300 } }, format::f32,
                              format::e5m2, cache_layout::hnd)
                            .scales(scales::per_kv_head, scales::per_tensor, 0.037f, 5.3f));
    for (const attn_case &c : cases) {
        SCOPED_TRACE(c.name());
        const attn_setup s = build_setup(c);
        const oracle::result ref = s.oracle_on_cache();
        packed_cache probe =
                make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::kv_shared);
        pa::reshape_and_cache::primitive_desc wpd = packed_writer(s, probe);
        int writers = 0;
        std::unique_ptr<packed_cache> first;
        scales_spec first_ks, first_vs;
        do {
            ++writers;
            SCOPED_TRACE(std::string("reshape_and_cache impl ") + wpd.impl_info_str());
            auto pc = std::make_unique<packed_cache>(
                    make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::kv_shared));
            scales_spec ks, vs;
            fill_packed(s, wpd, *pc, ks, vs);
            if (!first) {
                EXPECT_EQ(compare_packed_with_plain(*pc, s.cache, true), 0);
                EXPECT_EQ(compare_packed_with_plain(*pc, s.cache, false), 0);
                EXPECT_TRUE(same_bits(ks.values, s.ks.values));
                EXPECT_TRUE(same_bits(vs.values, s.vs.values));
                first_ks = ks;
                first_vs = vs;
            } else {
                EXPECT_EQ(std::memcmp(pc->k_mem.data(), first->k_mem.data(), pc->k_mem.size()), 0)
                        << "another writer left different bytes";
                EXPECT_TRUE(same_bits(ks.values, first_ks.values));
                EXPECT_TRUE(same_bits(vs.values, first_vs.values));
            }
            const std::vector<std::string> readers = attend_every_impl(s, *pc, ks, vs, ref);
            EXPECT_EQ(readers.back(), "ref:any");
            if (!first) first = std::move(pc);
        } while (wpd.next_impl());
        RecordProperty(c.tag + "_writers", std::to_string(writers));
    }
}

// ---------------------------------------------------------------------------------------------
// Non-finite values reach only the rows that see them

/// The bits of NaN (or, where the format has one, +inf) in format f, as the cache stores them.
/// Writes one element's bytes (the cache format's size) at (sequence, token, kv head, dim) of K or V,
/// in the setup's plain cache and in the packed one alike.
void put_element(attn_setup &s, packed_cache &pc, bool key, int64_t seq, int64_t token, int64_t head,
                 int64_t dim, const void *bytes) {
    const int64_t es = size_of(s.c.cache_fmt), block = s.b.block_of(seq, token), t = token % s.c.bs;
    char *plain = static_cast<char *>(key ? s.cache.k() : s.cache.v());
    char *packed = static_cast<char *>(key ? pc.k() : pc.v());
    std::memcpy(plain + (s.cache.offset(block, head, t) + dim) * es, bytes, static_cast<size_t>(es));
    const int64_t at = key ? pc.k_at(block, head, t, dim) : pc.v_at(block, head, t, dim);
    std::memcpy(packed + at * es, bytes, static_cast<size_t>(es));
}

std::vector<uint8_t> special_bytes(format f, bool nan) {
    switch (f) {
        case format::f32:
            return nan ? std::vector<uint8_t> { 0x00, 0x00, 0xC0, 0x7F }
                       : std::vector<uint8_t> { 0x00, 0x00, 0x80, 0x7F };
        case format::bf16: return { static_cast<uint8_t>(nan ? 0xC0 : 0x80), 0x7F };
        case format::f16: return { 0x00, static_cast<uint8_t>(nan ? 0x7E : 0x7C) };
        case format::e4m3: return { 0x7F }; // no infinity
        default: return { static_cast<uint8_t>(nan ? 0x7E : 0x7C) };
    }
}

// A causal prefill whose V holds NaN and inf at tokens that the first query rows do not see, whose K
// holds a NaN at a later token, and two of whose query rows hold a NaN: rows that do not see a special value
// match the oracle (finite), rows that do get what the oracle gets (NaN or inf). Items of 64 rows (GQA 4 x 16
// tokens): x64:amx multiplies the values of whole chunks in tiles, where 0 * inf would be NaN for the
// rows that must not see it.
TEST(packed_layout, non_finite_values_reach_only_the_rows_that_see_them) {
    for (format cache_fmt : { format::f32, format::bf16, format::e4m3, format::e5m2, format::f16 })
        for (format dst_fmt : { format::bf16, format::f32 }) {
            attn_case c = make_case("specials", 8, 2, 64, 16, { { 48, 100 }, { 1, 40 } }, format::bf16,
                                    cache_fmt, cache_layout::hnd)
                                  .dst(dst_fmt);
            c.shuffle = false;
            SCOPED_TRACE(c.name());
            attn_setup s = build_setup(c);
            packed_cache pc =
                    make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::dense);
            scales_spec ks, vs;
            fill_packed(s, packed_writer(s, pc), pc, ks, vs);
            // (token of sequence 0, kv head, dim, NaN?, in K?) ; the query rows are positions 52..99.
            struct special {
                int64_t token, head, dim;
                bool nan, key;
            };
            for (const special &x :
                 { special { 60, 0, 3, true, false }, special { 75, 1, 17, false, false },
                   special { 77, 0, 63, true, false }, special { 90, 1, 5, true, true } }) {
                const std::vector<uint8_t> bits = special_bytes(cache_fmt, x.nan);
                put_element(s, pc, x.key, 0, x.token, x.head, x.dim, bits.data());
            }
            // A NaN in two query rows (token 10, q head 1; the decode's token 48, q head 5): those
            // rows are NaN, the others of their tiles and kv heads are not.
            const uint16_t nan_bits = 0x7FC0;
            for (const std::pair<int64_t, int64_t> &th : { std::pair<int64_t, int64_t> { 10, 1 }, { 48, 5 } })
                std::memcpy(s.q.data() + ((th.first * c.hq + th.second) * c.d + 7) * 2, &nan_bits, 2);
            const oracle::result ref = s.oracle_on_cache();
            for (const std::pair<int64_t, int64_t> &th : { std::pair<int64_t, int64_t> { 10, 1 }, { 48, 5 } })
                EXPECT_TRUE(std::isnan(ref.out[ref.index(th.first, th.second, 0)])) << "test bug: the oracle";
            int64_t finite_rows = 0, special_rows = 0; // the test's own check that both kinds occur
            for (int64_t t = 0; t < s.b.tokens; ++t) {
                bool special_seen = false;
                for (int64_t d = 0; d < c.d; ++d)
                    special_seen = special_seen || !std::isfinite(ref.out[ref.index(t, 0, d)]);
                (special_seen ? special_rows : finite_rows)++;
            }
            EXPECT_GT(finite_rows, 8);
            EXPECT_GT(special_rows, 8);
            attend_every_impl(s, pc, ks, vs, ref);
        }
}

/// The largest power of two a cache format holds that keeps q . k and sum p |v| far inside f32.
double huge_of(format f) {
    switch (f) {
        case format::f32:
        case format::bf16: return 0x1p100;
        case format::f16: return 32768.;
        case format::e4m3: return 256.;
        default: return 32768.; // e5m2
    }
}
/// A unit whose small multiples are subnormal in f32 (f32 and bf16 caches) or in the cache format
/// itself (f16, e4m3, e5m2; normal f32 values once decoded), and exact in the format.
double subnormal_unit_of(format f) {
    switch (f) {
        case format::f32:
        case format::bf16: return 0x1p-130;
        case format::f16: return 0x1p-23;
        case format::e4m3: return 0x1p-9;
        default: return 0x1p-16; // e5m2
    }
}

// Huge and subnormal finite values are values: a key of huge magnitude (its rows' softmax becomes
// one-hot or gives it no weight), values of huge magnitude, a query row of f32-subnormal magnitude,
// a query holding +inf (its row is NaN), and a sequence whose V, in one kv head, is subnormal (f32
// subnormals for f32 and bf16 caches: those rows' outputs are subnormal, and are compared without
// the usual floor of 1e-37, so that a kernel that flushed them would fail). The one documented
// exception (README): bf16 dot products (VDPBF16PS, TDPBF16PS) count subnormal inputs as zero, so
// x64:avx512_bf16 and x64:amx, which multiply a bf16 cache's values by bf16 probabilities for a bf16
// dst, give exactly 0 there, which the test checks instead.
// Queries of large magnitude, mostly negative, against FP8 caches: the x64 kernels fold FP8's load
// unit (2^120 for e4m3, 2^112 for e5m2) into q only as far as the largest |q| leaves it finite, the
// rest into the scores. |q| up to 2^12 (times the softmax scale 1/8): q times the whole unit would
// overflow to -inf, so a largest |q| taken over the positive side alone gives NaN or wrong rows.
TEST(packed_layout, large_negative_queries_with_fp8_caches_match_the_oracle) {
    for (format cache_fmt : { format::e4m3, format::e5m2 }) {
        attn_case c = make_case("large_negative_q", 8, 2, 64, 16, { { 1, 100 }, { 2, 40 } }, format::bf16,
                                cache_fmt, cache_layout::hnd);
        SCOPED_TRACE(c.name());
        attn_setup s = build_setup(c);
        for (size_t i = 0; i < s.q_in.size(); ++i) // -4096 in most elements, small positive values elsewhere
            store_rounded(s.q.data(), c.q_fmt, static_cast<int64_t>(i), i % 5 == 0 ? 0.25 : -4096.);
        packed_cache pc = make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::dense);
        scales_spec ks, vs;
        fill_packed(s, packed_writer(s, pc), pc, ks, vs);
        const oracle::result ref = s.oracle_on_cache();
        for (double x : ref.out)
            ASSERT_TRUE(std::isfinite(x)) << "test bug: the oracle's output is not finite";
        attend_every_impl(s, pc, ks, vs, ref);
    }
}

TEST(packed_layout, huge_and_subnormal_values_are_values) {
    for (format cache_fmt : { format::f32, format::bf16, format::f16, format::e4m3, format::e5m2 })
        for (format dst_fmt : { format::bf16, format::f32 }) {
            attn_case c = make_case("extremes", 8, 2, 64, 16, { { 48, 100 }, { 1, 40 } }, format::bf16,
                                    cache_fmt, cache_layout::hnd)
                                  .dst(dst_fmt);
            c.shuffle = false;
            SCOPED_TRACE(c.name());
            attn_setup s = build_setup(c);
            packed_cache pc =
                    make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::dense);
            scales_spec ks, vs;
            fill_packed(s, packed_writer(s, pc), pc, ks, vs);
            // Writes x (exact in the format) at (sequence, token, kv head, dim) of K or V, plain and packed.
            const auto put = [&](bool key, int64_t seq, int64_t token, int64_t head, int64_t dim, double x) {
                unsigned char bits[4];
                store_rounded(bits, cache_fmt, 0, x);
                put_element(s, pc, key, seq, token, head, dim, bits);
            };
            const double huge = huge_of(cache_fmt), unit = subnormal_unit_of(cache_fmt);
            for (int64_t d = 0; d < c.d; ++d) {
                const double sign = (d * 7 + 3) % 3 == 0 ? -1. : 1.;
                put(true, 0, 70, 0, d, sign * huge);   // seen by rows at positions 70.. of q heads 0-3
                put(false, 0, 55, 1, d, -sign * huge); // q heads 4-7
                put(false, 0, 80, 1, d, sign * huge);
                for (int64_t j = 0; j < 40; ++j) // the decode sequence, kv head 0
                    put(false, 1, j, 0, d, sign * unit * static_cast<double>(1 + (d + j) % 3));
            }
            // Query: token 20, q head 2 scaled to f32 subnormals; token 30, q head 6 holds +inf in dim 5.
            for (int64_t d = 0; d < c.d; ++d) {
                const size_t i = static_cast<size_t>((20 * c.hq + 2) * c.d + d);
                store_rounded(s.q.data(), c.q_fmt, static_cast<int64_t>(i), s.q_in[i] * 0x1p-130);
            }
            store_rounded(s.q.data(), c.q_fmt, (30 * c.hq + 6) * c.d + 5, INFINITY);
            const oracle::result ref = s.oracle_on_cache();
            // The test's own checks: the inf row is NaN, the subnormal-V rows are tiny but not 0.
            EXPECT_TRUE(std::isnan(ref.out[ref.index(30, 6, 0)])) << "test bug: the oracle";
            const double decode_out = std::fabs(ref.out[ref.index(48, 0, 0)]);
            EXPECT_GT(decode_out, 0.);
            EXPECT_LT(decode_out, 4 * unit);
            // Rows of the decode token in kv head 0 without the 1e-37 floor: f32's subnormal spacing per
            // summed token, and half the dst's subnormal spacing.
            const double subnormal_slack = 40 * 0x1p-149 + (dst_fmt == format::bf16 ? 0x1p-134 : 0x1p-150);
            const auto tol = [&](size_t i) {
                const int64_t row = static_cast<int64_t>(i) / c.d, token = row / c.hq, head = row % c.hq;
                const double t = attention_tol(ref, i, dst_fmt);
                return token == 48 && head < 4 ? t - dst_floor(dst_fmt) + subnormal_slack : t;
            };
            pa::paged_attention::primitive_desc pd = packed_reader(s, pc);
            dnnl::stream st = make_stream();
            do {
                const std::string impl = pd.impl_info_str();
                SCOPED_TRACE("impl " + impl);
                const bool bf16_products = (impl == "x64:avx512_bf16" || impl == "x64:amx") &&
                                           cache_fmt == format::bf16 && dst_fmt == format::bf16;
                const pa::paged_attention prim(pd);
                buffer dst = s.make_dst();
                prim.execute(st, packed_args(s, pc, ks, vs, dst.data()));
                st.wait();
                const comparison cmp = bf16_products ? compare_attention(dst.data(), dst_fmt, ref)
                                                     : compare(dst.data(), dst_fmt, ref, tol);
                EXPECT_EQ(cmp.failures, 0) << cmp;
                EXPECT_EQ(cmp.checked, s.b.tokens * c.hq * c.d);
                if (bf16_products) {
                    int64_t nonzero = 0;
                    for (int64_t h = 0; h < 4; ++h)
                        for (int64_t d = 0; d < c.d; ++d)
                            nonzero += reference::load(dst.data(), dst_fmt,
                                                       static_cast<int64_t>(ref.index(48, h, d))) != 0;
                    EXPECT_EQ(nonzero, 0)
                            << "bf16 dot products no longer flush subnormal values: update README";
                }
            } while (pd.next_impl());
        }
}

// ---------------------------------------------------------------------------------------------
// Split KV ranges on the packed layout

// Plans that split the long sequences' KV ranges into 2 and 7 pieces (merged with log-sum-exp) match
// the oracle on every implementation: pieces that start and end inside 16-token groups and chunks,
// prefill items of 64 rows (x64:amx's tiles, bf16 and FP8, with a bf16 and an f32 dst) and a window
// that hides whole pieces from some rows.
TEST(packed_layout, split_kv_ranges_match_the_oracle) {
    const bool red = reduced();
    std::vector<attn_case> cases;
    cases.push_back(make_case("split_tiles", 8, 2, 128, 16, { { 64, red ? 700 : 1500 }, { 3, 90 } },
                              format::bf16, format::bf16, cache_layout::hnd));
    cases.push_back(make_case("split_e4m3", 8, 1, 80, 32, { { 24, red ? 500 : 1300 } }, format::bf16,
                              format::e4m3, cache_layout::hnd)
                            .scales(scales::per_token, scales::per_token)
                            .window(255, 0)
                            .with_sinks());
    cases.push_back(make_case("split_f32_dst", 4, 2, 48, 16, { { 20, 400 } }, format::bf16, format::e5m2,
                              cache_layout::hnd)
                            .scales(scales::per_kv_head, scales::per_tensor, 0.037f, 5.3f)
                            .dst(format::f32));
    for (const attn_case &c : cases) {
        SCOPED_TRACE(c.name());
        const attn_setup s = build_setup(c);
        const oracle::result ref = s.oracle_on_cache();
        packed_cache pc = make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::padded);
        scales_spec ks, vs;
        fill_packed(s, packed_writer(s, pc), pc, ks, vs);
        pa::paged_attention::primitive_desc pd = packed_reader(s, pc);
        dnnl::stream st = make_stream();
        do {
            SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
            const pa::paged_attention prim(pd);
            for (int splits : { 2, 7 }) {
                SCOPED_TRACE(std::to_string(splits) + " splits");
                const pa::paged_attention::plan plan(
                        pd,
                        pa::tensor(pa::tensor_desc({ s.b.num_seqs }, pa::data_type::s32),
                                   s.b.seq_lens.data()),
                        pa::tensor(pa::tensor_desc({ s.b.num_seqs + 1 }, pa::data_type::s32),
                                   s.b.query_start_loc.data()),
                        splits);
                EXPECT_GE(plan.split_items(), 2 * c.hkv) << "the long sequence's items must be split";
                buffer dst = s.make_dst();
                pa::exec_args a = packed_args(s, pc, ks, vs, dst.data());
                a[pa::ARG_PLAN] = plan.as_tensor();
                prim.execute(st, a);
                st.wait();
                const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
                EXPECT_EQ(cmp.failures, 0) << cmp;
            }
        } while (pd.next_impl());
    }
}

// A user scratchpad full of NaN bytes (0xFF) changes nothing: every implementation writes what it
// reads of its scratch first. Chunks of 16, 48 and 80 tokens leave x64:amx's last tile step half
// empty, whose probabilities must be zeros rather than whatever the scratch held.
TEST(packed_layout, a_nan_filled_user_scratchpad_changes_nothing) {
    for (format cache_fmt : { format::bf16, format::e4m3 }) {
        const attn_case c =
                make_case("nan_scratch", 8, 2, 64, 16, { { 40, 80 }, { 20, 140 }, { 9, 48 }, { 1, 30 } },
                          format::bf16, cache_fmt, cache_layout::hnd);
        SCOPED_TRACE(c.name());
        const attn_setup s = build_setup(c);
        const oracle::result ref = s.oracle_on_cache();
        packed_cache pc = make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::dense);
        scales_spec ks, vs;
        fill_packed(s, packed_writer(s, pc), pc, ks, vs);
        pa::primitive_attr attr = s.attr();
        attr.set_scratchpad_mode(pa::scratchpad_mode::user);
        const pa::tensor_desc qmd({ pa::runtime_dim, c.hq, c.d }, dt_of(c.q_fmt));
        pa::paged_attention::primitive_desc pd(
                engine(), pa::paged_attention::desc(qmd, pc.md(), pc.md(), qmd, s.opts), attr);
        dnnl::stream st = make_stream();
        do {
            SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
            const pa::paged_attention prim(pd);
            buffer scratch(pd.scratchpad_desc().get_size()); // 0xFF-filled
            buffer dst = s.make_dst();
            pa::exec_args a = packed_args(s, pc, ks, vs, dst.data());
            a[pa::ARG_SCRATCHPAD] = pa::tensor(pd.scratchpad_desc(), scratch.data());
            prim.execute(st, a);
            st.wait();
            const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
            EXPECT_EQ(cmp.failures, 0) << cmp;
        } while (pd.next_impl());
    }
}

// A caller that sets flush-to-zero and denormals-are-zero in MXCSR (as some engines do for speed)
// gets the same results within the oracle's tolerance on every implementation, FP8 subnormals
// included (the decoders do not go through f32 denormals; only values below FLT_MIN are lost, which
// the tolerance's FLT_MIN term allows). The bits are set in the calling thread; TBB's workers run
// with the FP settings of the thread that starts a parallel algorithm.
TEST(packed_layout, ftz_and_daz_in_mxcsr_change_nothing_beyond_rounding) {
#if defined(__x86_64__) || defined(__i386__)
    for (format cache_fmt : { format::e4m3, format::e5m2, format::bf16 }) {
        const attn_case c = make_case("ftz_daz", 8, 2, 64, 16, { { 40, 100 }, { 1, 300 } }, format::bf16,
                                      cache_fmt, cache_layout::hnd)
                                    .scales(is_fp8(cache_fmt) ? scales::per_token : scales::none,
                                            is_fp8(cache_fmt) ? scales::per_token : scales::none)
                                    .with_outliers();
        SCOPED_TRACE(c.name());
        const attn_setup s = build_setup(c);
        const oracle::result ref = s.oracle_on_cache();
        packed_cache pc = make_packed(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, region_layout::dense);
        scales_spec ks, vs;
        fill_packed(s, packed_writer(s, pc), pc, ks, vs);
        const unsigned saved = _mm_getcsr();
        _mm_setcsr(saved | 0x8040u); // FTZ (bit 15) and DAZ (bit 6)
        const std::vector<std::string> names = attend_every_impl(s, pc, ks, vs, ref);
        const unsigned after = _mm_getcsr();
        _mm_setcsr(saved);
        // Control bits only: the exception flags (bits 0-5) are sticky and set by any inexact
        // result the calling thread computes, which depends on how TBB shared the work out.
        EXPECT_EQ(after & ~0x3Fu, (saved | 0x8040u) & ~0x3Fu) << "the library changed the caller's MXCSR";
        EXPECT_EQ(names.back(), "ref:any");
    }
#else
    GTEST_SKIP() << "MXCSR is x86's";
#endif
}

} // namespace
