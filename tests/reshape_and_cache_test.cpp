// reshape_and_cache against expected bytes built from the format definitions of
// tests/reference_formats.hpp: every byte of every cache allocation is compared, so skipped slots,
// padding between strided rows and the other cache of a K/V-interleaved allocation must all keep
// their sentinel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "reference_formats.hpp"

namespace {

using namespace pagedattn;

constexpr uint8_t sentinel = 0xA5;

enum class cache_layout { hnd, nhd, kv_interleaved, padded, any };
enum class scales_kind { none, per_tensor, per_head, per_token };

const char *layout_str(cache_layout l) {
    switch (l) {
        case cache_layout::hnd: return "hnd";
        case cache_layout::nhd: return "nhd";
        case cache_layout::kv_interleaved: return "kv_interleaved";
        case cache_layout::padded: return "padded";
        case cache_layout::any: return "any";
    }
    return "?";
}

const char *scales_str(scales_kind s) {
    switch (s) {
        case scales_kind::none: return "none";
        case scales_kind::per_tensor: return "per_tensor";
        case scales_kind::per_head: return "per_head";
        case scales_kind::per_token: return "per_token";
    }
    return "?";
}

// Local names so that the test does not depend on the library's data_type_name.
const char *dt_str(data_type dt) {
    switch (dt) {
        case data_type::f32: return "f32";
        case data_type::bf16: return "bf16";
        case data_type::f16: return "f16";
        case data_type::f8_e4m3: return "f8_e4m3";
        case data_type::f8_e5m2: return "f8_e5m2";
        case data_type::s32: return "s32";
        case data_type::s64: return "s64";
        default: return "?";
    }
}

size_t elem_size(data_type dt) {
    switch (dt) {
        case data_type::f32:
        case data_type::s32: return 4;
        case data_type::bf16:
        case data_type::f16: return 2;
        case data_type::f8_e4m3:
        case data_type::f8_e5m2: return 1;
        case data_type::s64: return 8;
        default: return 0;
    }
}

bool is_fp8(data_type dt) {
    return dt == data_type::f8_e4m3 || dt == data_type::f8_e5m2;
}

reference::format ref_format(data_type dt) {
    switch (dt) {
        case data_type::bf16: return reference::format::bf16;
        case data_type::f16: return reference::format::f16;
        case data_type::f8_e4m3: return reference::format::e4m3;
        case data_type::f8_e5m2: return reference::format::e5m2;
        default: return reference::format::f32;
    }
}

uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}

// The reference encoders are slow (a search over codes), and the tests draw their inputs from a
// small pool, so memoize by (format, f32 bits).
uint32_t expected_code(reference::format f, float x) {
    static std::unordered_map<uint64_t, uint32_t> memo;
    const uint64_t key = (static_cast<uint64_t>(f) << 32) | float_bits(x);
    const auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    uint32_t code = 0;
    switch (f) {
        case reference::format::f32: code = float_bits(x); break;
        case reference::format::bf16: code = reference::double_to_bf16(x); break;
        case reference::format::f16: code = reference::double_to_f16(x); break;
        case reference::format::e4m3:
        case reference::format::e5m2: code = reference::encode_fp8_slow(f, x); break;
    }
    memo.emplace(key, code);
    return code;
}

// A [T, H, D] key or value tensor with padded token and head strides, and its values as f32.
struct input_tensor {
    data_type dt;
    dim t, h, d, token_stride, head_stride;
    std::vector<uint8_t> bytes;
    std::vector<float> values; // dense [t][h][d]

    float at(dim ti, dim hi, dim di) const { return values[(ti * h + hi) * d + di]; }
    tensor_desc desc() const { return tensor_desc({ t, h, d }, dt, { token_stride, head_stride, 1 }); }
    tensor as_tensor() const { return tensor(desc(), bytes.data()); }
};

// v in the input's type: its bits and the f32 value the library will see.
struct encoded_input {
    uint32_t bits;
    float value;
};

encoded_input encode_input(data_type dt, double v) {
    if (dt == data_type::f32) {
        const float x = static_cast<float>(v);
        return { float_bits(x), x };
    }
    const uint16_t b = dt == data_type::bf16 ? reference::double_to_bf16(v) : reference::double_to_f16(v);
    return { b, static_cast<float>(dt == data_type::bf16 ? reference::bf16_to_double(b)
                                                         : reference::f16_to_double(b)) };
}

void set_input(input_tensor &in, dim ti, dim hi, dim di, const encoded_input &e) {
    const size_t es = elem_size(in.dt);
    std::memcpy(in.bytes.data() + (ti * in.token_stride + hi * in.head_stride + di) * es, &e.bits, es);
    in.values[(ti * in.h + hi) * in.d + di] = e.value;
}

void set_input(input_tensor &in, dim ti, dim hi, dim di, double v) {
    set_input(in, ti, hi, di, encode_input(in.dt, v));
}

// Random values from a small pool (so the memoized reference encoders stay fast), outliers of
// +-300, and a few special rows: all zeros, tiny (per-token scale clamps at FLT_MIN), all NaN/inf,
// and single NaN/-NaN/+-inf positions.
// Token-major with padding by default; head-major ([H][T][D] in memory) when asked.
input_tensor make_input(data_type dt, dim t, dim h, dim d, bool head_major, std::mt19937 &rng) {
    input_tensor in { dt, t, h, d, h * (d + 3) + 5, d + 3, {}, {} };
    if (head_major) {
        in.token_stride = d;
        in.head_stride = t * d + 7;
    }
    // At least one element, so that an empty step still passes a non-null pointer.
    const dim extent = t == 0 ? 0 : (t - 1) * in.token_stride + (h - 1) * in.head_stride + d;
    in.bytes.assign(std::max<dim>(extent, 1) * elem_size(dt), 0x5A);
    in.values.assign(t * h * d, 0.f);
    std::uniform_real_distribution<double> uni(-4.0, 4.0);
    // Encoded once: the reference encoders are too slow for every element of the large cases.
    std::vector<encoded_input> pool(257);
    for (encoded_input &p : pool)
        p = encode_input(dt, uni(rng));
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    const double inf = std::numeric_limits<double>::infinity(),
                 nan = std::numeric_limits<double>::quiet_NaN();
    for (dim ti = 0; ti < t; ++ti)
        for (dim hi = 0; hi < h; ++hi)
            for (dim di = 0; di < d; ++di) {
                const encoded_input &e = pool[pick(rng)];
                if (ti == 0 && hi == 0)
                    set_input(in, ti, hi, di, 0.0);
                else if (ti == 1 && hi == h - 1)
                    set_input(in, ti, hi, di, 1e-39 * static_cast<double>(di % 5 - 2));
                else if (ti == 2 && hi == 0)
                    set_input(in, ti, hi, di, di % 3 == 0 ? nan : di % 3 == 1 ? inf : -inf);
                else if ((ti * 31 + hi * 7 + di) % 97 == 11)
                    set_input(in, ti, hi, di, di % 2 ? 300.0 : -300.0);
                else
                    set_input(in, ti, hi, di, e);
            }
    if (t > 7) {
        set_input(in, 4, 0, 3 % d, nan);
        set_input(in, 5, h - 1, d - 1, -inf);
        set_input(in, 6, 0, 0, inf);
        set_input(in, 7, h - 1, d / 2, -nan);
    }
    return in;
}

struct rac_case {
    data_type in_dt, cache_dt;
    cache_layout layout;
    data_type slot_dt;
    scales_kind k_scales, v_scales;
    dim t = 37, h = 2, d = 48, bs = 16, nb = 6;
    bool duplicates = false;
    bool many_duplicates = false; // the second half of the tokens rewrites slots of the first half
    bool head_major_input = false;
};

// Element strides of both caches and where K and V start in one arena allocation.
struct geometry {
    dims strides;
    dim k_offset, v_offset, total; // in elements
};

geometry make_geometry(const rac_case &c) {
    const dim h = c.h, d = c.d, bs = c.bs, nb = c.nb;
    switch (c.layout) {
        case cache_layout::hnd:
        case cache_layout::any:
            return { { h * bs * d, bs * d, d, 1 }, 0, nb * h * bs * d, 2 * nb * h * bs * d };
        case cache_layout::nhd:
            return { { bs * h * d, d, h * d, 1 }, 0, nb * h * bs * d, 2 * nb * h * bs * d };
        case cache_layout::kv_interleaved:
            return { { 2 * h * bs * d, bs * d, d, 1 }, 0, h * bs * d, 2 * nb * h * bs * d };
        case cache_layout::padded: {
            const dim ts = d + 8, hs = bs * ts + 4, bstride = h * hs + 12;
            return { { bstride, hs, ts, 1 }, 0, nb * bstride, 2 * nb * bstride };
        }
    }
    return {};
}

int scales_mask(scales_kind s) {
    switch (s) {
        case scales_kind::per_tensor: return scales_per_tensor;
        case scales_kind::per_head: return scales_per_kv_head;
        case scales_kind::per_token: return scales_per_token;
        default: return -1;
    }
}

// Scale inputs for per-tensor / per-head (non-unit, not powers of two), and a sentinel-filled
// buffer for per-token scales, which the primitive writes.
std::vector<float> make_scales(scales_kind s, const rac_case &c, bool is_value) {
    switch (s) {
        case scales_kind::per_tensor: return { is_value ? 5.3f : 0.037f };
        case scales_kind::per_head: {
            std::vector<float> v(c.h);
            for (dim i = 0; i < c.h; ++i)
                v[i] = (is_value ? 5.3f : 0.037f) * (1.f + 0.37f * static_cast<float>(i));
            return v;
        }
        case scales_kind::per_token: {
            std::vector<float> v(c.nb * c.h * c.bs);
            std::memset(v.data(), sentinel, v.size() * sizeof(float));
            return v;
        }
        default: return {};
    }
}

tensor_desc scales_desc(scales_kind s, const rac_case &c) {
    switch (s) {
        case scales_kind::per_tensor: return tensor_desc({ 1 }, data_type::f32);
        case scales_kind::per_head: return tensor_desc({ c.h }, data_type::f32);
        case scales_kind::per_token: return tensor_desc({ c.nb, c.h, c.bs }, data_type::f32);
        default: return {};
    }
}

// A permutation of the slots, with a few negative entries (skipped), and optionally two pairs of
// tokens that share a slot.
std::vector<int64_t> make_slots(const rac_case &c, std::mt19937 &rng) {
    std::vector<int64_t> all(c.nb * c.bs);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> slots(all.begin(), all.begin() + c.t);
    for (dim i = 3; i < c.t; i += 7)
        slots[i] = -1;
    if (c.t > 4) slots[c.t - 2] = -5;
    if (c.t > 12)
        slots[12] = c.slot_dt == data_type::s32 ? std::numeric_limits<int32_t>::min() : -(int64_t(1) << 40);
    if (c.duplicates && c.t > 9) {
        slots[8] = slots[1]; // token 8 overwrites token 1
        slots[9] = slots[5];
        slots[c.t - 1] = slots[8]; // and the last token overwrites both
    }
    if (c.many_duplicates)
        for (dim i = c.t / 2; i < c.t; i += 3)
            if (slots[i - c.t / 2] >= 0) slots[i] = slots[i - c.t / 2];
    return slots;
}

struct expected_state {
    std::vector<uint8_t> arena;
    std::vector<bool> nan_at; // per arena element: the expected value is NaN (any NaN code is fine)
    std::vector<float> k_scales, v_scales;
};

float scale_of(scales_kind s, const std::vector<float> &given, dim hi) {
    switch (s) {
        case scales_kind::per_tensor: return given[0];
        case scales_kind::per_head: return given[hi];
        default: return 1.f;
    }
}

// max(amax / fp8_max, FLT_MIN) in f32, NaN and +-inf ignored in amax.
float per_token_scale(const input_tensor &in, dim ti, dim hi, data_type cache_dt) {
    float amax = 0.f;
    for (dim di = 0; di < in.d; ++di) {
        const float a = std::fabs(in.at(ti, hi, di));
        if (std::isfinite(a)) amax = std::max(amax, a);
    }
    const float fp8_max = cache_dt == data_type::f8_e4m3 ? 448.f : 57344.f;
    return std::max(amax / fp8_max, FLT_MIN);
}

void write_expected(const rac_case &c, const geometry &g, const input_tensor &in, dim base, scales_kind sk,
                    const std::vector<float> &given_scales, std::vector<float> &scales_out,
                    const std::vector<int64_t> &slots, expected_state &e) {
    const size_t es = elem_size(c.cache_dt);
    const reference::format f = ref_format(c.cache_dt);
    for (dim ti = 0; ti < c.t; ++ti) {
        if (slots[ti] < 0) continue;
        const dim block = slots[ti] / c.bs, off = slots[ti] % c.bs;
        for (dim hi = 0; hi < c.h; ++hi) {
            float scale = scale_of(sk, given_scales, hi);
            if (sk == scales_kind::per_token) {
                scale = per_token_scale(in, ti, hi, c.cache_dt);
                scales_out[(block * c.h + hi) * c.bs + off] = scale;
            }
            for (dim di = 0; di < c.d; ++di) {
                const dim el = base + block * g.strides[0] + hi * g.strides[1] + off * g.strides[2] + di;
                const float x = in.at(ti, hi, di);
                // FP8 quantizes x / scale (an f32 division); other caches store x rounded.
                const uint32_t code = expected_code(f, is_fp8(c.cache_dt) ? x / scale : x);
                std::memcpy(e.arena.data() + el * es, &code, es); // little endian
                // The reference FP8 NaN code is the one the design fixes; other formats only promise a NaN.
                e.nan_at[el] = std::isnan(x) && !is_fp8(c.cache_dt);
            }
        }
    }
}

bool decodes_to_nan(data_type dt, const uint8_t *p) {
    return std::isnan(reference::load(p, ref_format(dt), 0));
}

// Compares the arena element by element and reports the first mismatches with their position.
void compare_arena(const rac_case &c, const geometry &g, const std::vector<uint8_t> &actual,
                   const expected_state &e) {
    const size_t es = elem_size(c.cache_dt);
    int reported = 0;
    dim mismatches = 0;
    for (dim el = 0; el < g.total; ++el) {
        const uint8_t *a = actual.data() + el * es, *x = e.arena.data() + el * es;
        const bool ok = e.nan_at[el] ? decodes_to_nan(c.cache_dt, a) : std::memcmp(a, x, es) == 0;
        if (ok) continue;
        ++mismatches;
        if (reported++ < 5) {
            uint32_t av = 0, xv = 0;
            std::memcpy(&av, a, es);
            std::memcpy(&xv, x, es);
            ADD_FAILURE() << "cache element " << el << " (" << (el >= g.v_offset ? "v" : "k")
                          << " side): got 0x" << std::hex << av << ", expected 0x" << xv << std::dec;
        }
    }
    EXPECT_EQ(mismatches, 0) << "mismatching cache elements of " << g.total;
}

void compare_scales(const char *name, const std::vector<float> &actual, const std::vector<float> &expected) {
    ASSERT_EQ(actual.size(), expected.size());
    int reported = 0;
    for (size_t i = 0; i < actual.size(); ++i)
        if (float_bits(actual[i]) != float_bits(expected[i]) && reported++ < 5)
            ADD_FAILURE() << name << "[" << i << "]: got " << actual[i] << " (0x" << std::hex
                          << float_bits(actual[i]) << "), expected " << expected[i] << " (0x"
                          << float_bits(expected[i]) << ")" << std::dec;
    EXPECT_EQ(reported, 0) << name;
}

void run_case(const rac_case &c, uint32_t seed) {
    std::mt19937 rng(seed);
    const input_tensor key = make_input(c.in_dt, c.t, c.h, c.d, c.head_major_input, rng);
    const input_tensor value = make_input(c.in_dt, c.t, c.h, c.d, c.head_major_input, rng);
    const std::vector<uint8_t> key_before = key.bytes, value_before = value.bytes;
    const std::vector<int64_t> slots = make_slots(c, rng);
    const geometry g = make_geometry(c);
    const size_t es = elem_size(c.cache_dt);

    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const dims cache_dims { c.nb, c.h, c.bs, c.d };
    const tensor_desc cache_md = c.layout == cache_layout::any
                                         ? tensor_desc(cache_dims, c.cache_dt, layout::any)
                                         : tensor_desc(cache_dims, c.cache_dt, g.strides);
    reshape_and_cache::desc d(tensor_desc({ runtime_dim, c.h, c.d }, c.in_dt),
                              tensor_desc({ runtime_dim, c.h, c.d }, c.in_dt), cache_md, cache_md);
    primitive_attr attr;
    if (c.k_scales != scales_kind::none) attr.set_scales_mask(ARG_K_CACHE, scales_mask(c.k_scales));
    if (c.v_scales != scales_kind::none) attr.set_scales_mask(ARG_V_CACHE, scales_mask(c.v_scales));
    reshape_and_cache::primitive_desc pd(eng, d, attr);
    reshape_and_cache prim(pd);

    tensor_desc exec_md = cache_md;
    if (c.layout == cache_layout::any) {
        // any resolves to dense plain HND for these dims (D % 16 != 0: no packed layout applies).
        exec_md = pd.query_md(ARG_K_CACHE);
        ASSERT_EQ(exec_md.get_layout(), layout::plain);
        ASSERT_EQ(exec_md.get_dims(), cache_dims);
        ASSERT_EQ(exec_md.get_strides(), g.strides);
        ASSERT_EQ(exec_md.get_data_type(), c.cache_dt);
        ASSERT_EQ(exec_md.get_size(), static_cast<size_t>(c.nb * c.h * c.bs * c.d) * es);
        ASSERT_EQ(pd.query_md(ARG_V_CACHE), exec_md);
    }

    std::vector<uint8_t> arena(g.total * es, sentinel);
    std::vector<float> k_scales = make_scales(c.k_scales, c, false),
                       v_scales = make_scales(c.v_scales, c, true);
    const std::vector<float> k_scales_given = k_scales, v_scales_given = v_scales;

    std::vector<int64_t> slots64 = slots;
    std::vector<int32_t> slots32(slots.begin(), slots.end());
    slots64.push_back(0); // non-null data even for T = 0
    slots32.push_back(0);
    const void *slot_data =
            c.slot_dt == data_type::s64 ? static_cast<const void *>(slots64.data()) : slots32.data();

    exec_args args { { ARG_KEY, key.as_tensor() },
                     { ARG_VALUE, value.as_tensor() },
                     { ARG_K_CACHE, tensor(exec_md, arena.data() + g.k_offset * es) },
                     { ARG_V_CACHE, tensor(exec_md, arena.data() + g.v_offset * es) },
                     { ARG_SLOT_MAPPING, tensor(tensor_desc({ c.t }, c.slot_dt), slot_data) } };
    if (c.k_scales != scales_kind::none)
        args.emplace(ARG_K_SCALES, tensor(scales_desc(c.k_scales, c), k_scales.data()));
    if (c.v_scales != scales_kind::none)
        args.emplace(ARG_V_SCALES, tensor(scales_desc(c.v_scales, c), v_scales.data()));
    prim.execute(s, args);
    s.wait();

    expected_state e { std::vector<uint8_t>(g.total * es, sentinel), std::vector<bool>(g.total, false),
                       k_scales_given, v_scales_given };
    write_expected(c, g, key, g.k_offset, c.k_scales, k_scales_given, e.k_scales, slots, e);
    write_expected(c, g, value, g.v_offset, c.v_scales, v_scales_given, e.v_scales, slots, e);

    compare_arena(c, g, arena, e);
    compare_scales("k_scales", k_scales, e.k_scales);
    compare_scales("v_scales", v_scales, e.v_scales);
    EXPECT_EQ(key.bytes, key_before) << "key was modified";
    EXPECT_EQ(value.bytes, value_before) << "value was modified";
}

std::string case_name(const rac_case &c) {
    std::string n = std::string(dt_str(c.in_dt)) + "_to_" + dt_str(c.cache_dt) + "_" + layout_str(c.layout) +
                    "_" + dt_str(c.slot_dt);
    if (c.k_scales != scales_kind::none) n += std::string("_k_") + scales_str(c.k_scales);
    if (c.v_scales != scales_kind::none) n += std::string("_v_") + scales_str(c.v_scales);
    if (c.duplicates) n += "_duplicates";
    if (c.many_duplicates) n += "_many_duplicates";
    if (c.head_major_input) n += "_head_major_input";
    return n;
}

// One test per (input type, cache type) pair, looping over layouts, slot types and scale kinds:
// ctest runs each test in its own process, so a finer split costs more in start-up than in work.
struct type_pair {
    data_type in_dt, cache_dt;
};

// gtest prints parameters with this (instead of a byte dump) in failure messages.
void PrintTo(const type_pair &p, std::ostream *os) {
    *os << dt_str(p.in_dt) << "_to_" << dt_str(p.cache_dt);
}

std::vector<type_pair> type_pairs() {
    std::vector<type_pair> pairs;
    for (data_type in_dt : { data_type::f32, data_type::bf16, data_type::f16 })
        for (data_type cache_dt :
             { data_type::f32, data_type::bf16, data_type::f16, data_type::f8_e4m3, data_type::f8_e5m2 })
            pairs.push_back({ in_dt, cache_dt });
    return pairs;
}

class reshape_and_cache_sweep : public testing::TestWithParam<type_pair> {};

TEST_P(reshape_and_cache_sweep, every_layout_slot_type_and_scales_kind) {
    const type_pair tp = GetParam();
    std::vector<scales_kind> kinds { scales_kind::none };
    if (is_fp8(tp.cache_dt))
        kinds.insert(kinds.end(), { scales_kind::per_tensor, scales_kind::per_head, scales_kind::per_token });
    for (cache_layout l :
         { cache_layout::hnd, cache_layout::nhd, cache_layout::kv_interleaved, cache_layout::padded })
        for (data_type slot_dt : { data_type::s64, data_type::s32 })
            for (scales_kind sk : kinds) {
                const rac_case c { tp.in_dt, tp.cache_dt, l, slot_dt, sk, sk };
                SCOPED_TRACE(case_name(c));
                run_case(c, 1234);
            }
}

INSTANTIATE_TEST_SUITE_P(all, reshape_and_cache_sweep, testing::ValuesIn(type_pairs()),
                         [](const testing::TestParamInfo<type_pair> &info) {
                             return std::string(dt_str(info.param.in_dt)) + "_to_" +
                                    dt_str(info.param.cache_dt);
                         });

// K and V with different scale masks in one primitive.
TEST(reshape_and_cache, mixed_scale_masks) {
    run_case({ data_type::bf16, data_type::f8_e4m3, cache_layout::kv_interleaved, data_type::s64,
               scales_kind::per_tensor, scales_kind::per_token },
             7);
    run_case({ data_type::f32, data_type::f8_e5m2, cache_layout::nhd, data_type::s32, scales_kind::per_token,
               scales_kind::per_head },
             8);
    run_case({ data_type::f16, data_type::f8_e4m3, cache_layout::hnd, data_type::s32, scales_kind::none,
               scales_kind::per_tensor },
             9);
}

// Two tokens mapped to one slot: the later token is stored (and, per token, its scale).
TEST(reshape_and_cache, later_token_wins_on_duplicate_slot) {
    for (data_type cache_dt : { data_type::f32, data_type::bf16, data_type::f8_e4m3 }) {
        for (scales_kind sk : { scales_kind::none, scales_kind::per_token }) {
            if (sk != scales_kind::none && !is_fp8(cache_dt)) continue;
            rac_case c { data_type::f32, cache_dt, cache_layout::hnd, data_type::s64, sk, sk };
            c.duplicates = true;
            SCOPED_TRACE(case_name(c));
            run_case(c, 21);
        }
    }
}

// A minimal duplicate check that does not rely on the expected-state builder: two distinct rows
// into one slot, the cache row must equal the second one.
TEST(reshape_and_cache, duplicate_slot_minimal) {
    const dim h = 1, d = 4, bs = 2, nb = 2;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const tensor_desc cache_md({ nb, h, bs, d }, data_type::f32, dims { h * bs * d, bs * d, d, 1 });
    reshape_and_cache::desc desc(tensor_desc({ runtime_dim, h, d }, data_type::f32),
                                 tensor_desc({ runtime_dim, h, d }, data_type::f32), cache_md, cache_md);
    reshape_and_cache prim(reshape_and_cache::primitive_desc(eng, desc));
    std::vector<float> k { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 },
            v { -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12 };
    std::vector<float> kc(nb * h * bs * d, -100.f), vc(nb * h * bs * d, -100.f);
    std::vector<int32_t> slots { 3, 0, 3 }; // tokens 0 and 2 both go to slot 3
    prim.execute(s, { { ARG_KEY, tensor(tensor_desc({ 3, h, d }, data_type::f32), k.data()) },
                      { ARG_VALUE, tensor(tensor_desc({ 3, h, d }, data_type::f32), v.data()) },
                      { ARG_K_CACHE, tensor(cache_md, kc.data()) },
                      { ARG_V_CACHE, tensor(cache_md, vc.data()) },
                      { ARG_SLOT_MAPPING, tensor(tensor_desc({ 3 }, data_type::s32), slots.data()) } });
    s.wait();
    const std::vector<float> kc_expected { 5,    6,    7,    8,    -100, -100, -100, -100,
                                           -100, -100, -100, -100, 9,    10,   11,   12 };
    const std::vector<float> vc_expected { -5,   -6,   -7,   -8,   -100, -100, -100, -100,
                                           -100, -100, -100, -100, -9,   -10,  -11,  -12 };
    EXPECT_EQ(kc, kc_expected);
    EXPECT_EQ(vc, vc_expected);
}

// layout::any: query_md gives dense HND strides and the cache written through them is right.
TEST(reshape_and_cache, layout_any_resolves_to_dense_plain) {
    for (data_type cache_dt : { data_type::bf16, data_type::f8_e4m3, data_type::f32 }) {
        const scales_kind sk = is_fp8(cache_dt) ? scales_kind::per_token : scales_kind::none;
        rac_case c { data_type::bf16, cache_dt, cache_layout::any, data_type::s64, sk, sk };
        c.bs = 12;
        c.d = 40;
        SCOPED_TRACE(case_name(c));
        run_case(c, 33);
    }
}

// Odd shapes: block size 1, one head, head size 1 and a large head size; token count that does not
// fill the cache.
TEST(reshape_and_cache, odd_shapes) {
    struct shape {
        dim t, h, d, bs, nb;
    };
    for (const shape sh : { shape { 5, 1, 1, 1, 8 }, shape { 9, 3, 80, 5, 3 }, shape { 12, 1, 512, 3, 5 } }) {
        rac_case c { data_type::bf16, data_type::f8_e5m2,     cache_layout::nhd,
                     data_type::s32,  scales_kind::per_token, scales_kind::per_head };
        c.t = sh.t;
        c.h = sh.h;
        c.d = sh.d;
        c.bs = sh.bs;
        c.nb = sh.nb;
        SCOPED_TRACE(case_name(c) + " t=" + std::to_string(sh.t) + " d=" + std::to_string(sh.d));
        run_case(c, 5);
    }
}

// An empty step (T = 0) writes nothing.
TEST(reshape_and_cache, zero_tokens) {
    rac_case c { data_type::f32, data_type::f8_e4m3,     cache_layout::hnd,
                 data_type::s64, scales_kind::per_token, scales_kind::per_token };
    c.t = 0;
    run_case(c, 1);
}

// One large step compared whole, so that the parallel partition is exercised.
TEST(reshape_and_cache, large_parallel) {
    rac_case c { data_type::bf16, data_type::f8_e4m3,     cache_layout::kv_interleaved,
                 data_type::s64,  scales_kind::per_token, scales_kind::per_token };
    c.t = 4096;
    c.h = 8;
    c.d = 128;
    c.bs = 16;
    c.nb = 300;
    run_case(c, 4096);
}

// Many tokens rewriting slots written earlier in the same call, across the parallel partition.
TEST(reshape_and_cache, large_parallel_with_duplicate_slots) {
    rac_case c { data_type::f32, data_type::f8_e4m3,     cache_layout::nhd,
                 data_type::s32, scales_kind::per_token, scales_kind::per_head };
    c.t = 3000;
    c.h = 4;
    c.d = 64;
    c.bs = 16;
    c.nb = 200;
    c.many_duplicates = true;
    run_case(c, 99);
}

// Key and value stored head-major ([H][T][D]): the head stride exceeds the token stride.
TEST(reshape_and_cache, head_major_inputs) {
    for (data_type cache_dt : { data_type::bf16, data_type::f8_e5m2 }) {
        const scales_kind sk = is_fp8(cache_dt) ? scales_kind::per_token : scales_kind::none;
        rac_case c { data_type::f16, cache_dt, cache_layout::padded, data_type::s64, sk, sk };
        c.head_major_input = true;
        SCOPED_TRACE(case_name(c));
        run_case(c, 17);
    }
}

TEST(reshape_and_cache, large_parallel_per_tensor_f16_input) {
    rac_case c { data_type::f16, data_type::f8_e5m2,      cache_layout::hnd,
                 data_type::s32, scales_kind::per_tensor, scales_kind::per_head };
    c.t = 4096;
    c.h = 8;
    c.d = 128;
    c.bs = 32;
    c.nb = 130;
    run_case(c, 77);
}

// Repeated executes of one primitive (decode steps) append tokens without disturbing earlier ones.
TEST(reshape_and_cache, successive_steps_accumulate) {
    const dim h = 2, d = 8, bs = 4, nb = 3;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const tensor_desc cache_md({ nb, h, bs, d }, data_type::bf16, dims { h * bs * d, bs * d, d, 1 });
    reshape_and_cache::desc desc(tensor_desc({ runtime_dim, h, d }, data_type::f32),
                                 tensor_desc({ runtime_dim, h, d }, data_type::f32), cache_md, cache_md);
    reshape_and_cache prim(reshape_and_cache::primitive_desc(eng, desc));
    std::vector<uint16_t> kc(nb * h * bs * d, 0xA5A5), vc(nb * h * bs * d, 0xA5A5);
    std::vector<uint16_t> kc_expected = kc, vc_expected = vc;
    for (int step = 0; step < 5; ++step) {
        std::vector<float> k(h * d), v(h * d);
        for (dim i = 0; i < h * d; ++i) {
            k[i] = 0.1f * static_cast<float>(step * 100 + i) + 0.013f;
            v[i] = -k[i] * 3.7f;
        }
        const int64_t slot = (step * 5) % (nb * bs);
        prim.execute(s, { { ARG_KEY, tensor(tensor_desc({ 1, h, d }, data_type::f32), k.data()) },
                          { ARG_VALUE, tensor(tensor_desc({ 1, h, d }, data_type::f32), v.data()) },
                          { ARG_K_CACHE, tensor(cache_md, kc.data()) },
                          { ARG_V_CACHE, tensor(cache_md, vc.data()) },
                          { ARG_SLOT_MAPPING, tensor(tensor_desc({ 1 }, data_type::s64), &slot) } });
        s.wait();
        const dim block = slot / bs, off = slot % bs;
        for (dim hi = 0; hi < h; ++hi)
            for (dim di = 0; di < d; ++di) {
                const dim el = block * h * bs * d + hi * bs * d + off * d + di;
                kc_expected[el] = reference::double_to_bf16(k[hi * d + di]);
                vc_expected[el] = reference::double_to_bf16(v[hi * d + di]);
            }
        EXPECT_EQ(kc, kc_expected) << "step " << step;
        EXPECT_EQ(vc, vc_expected) << "step " << step;
    }
}

// A cache written through layout::any is read by paged_attention through the same query_md: two
// decode tokens, whose expected output is computed in double from the dequantized reference codes.
TEST(reshape_and_cache, written_cache_is_read_by_paged_attention) {
    const dim hq = 4, h = 2, d = 40, bs = 12, nb = 3;
    const data_type cache_dt = data_type::f8_e4m3;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const tensor_desc any({ nb, h, bs, d }, cache_dt, layout::any);
    primitive_attr attr;
    attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
    attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
    reshape_and_cache::primitive_desc rpd(
            eng,
            reshape_and_cache::desc(tensor_desc({ runtime_dim, h, d }, data_type::f32),
                                    tensor_desc({ runtime_dim, h, d }, data_type::f32), any, any),
            attr);
    paged_attention::primitive_desc ppd(
            eng,
            paged_attention::desc(tensor_desc({ runtime_dim, hq, d }, data_type::f32), any, any,
                                  tensor_desc({ runtime_dim, hq, d }, data_type::f32)),
            attr);
    const tensor_desc cache_md = rpd.query_md(ARG_K_CACHE);
    ASSERT_EQ(ppd.query_md(ARG_K_CACHE), cache_md);

    // Sequence 0: one token in block 2. Sequence 1: three tokens in block 1. (KV token j of a
    // sequence sits at offset j % bs of its table's block j / bs.)
    const dim t = 4;
    const std::vector<int64_t> slots { 2 * bs, bs + 0, bs + 1, bs + 2 };
    std::vector<float> k(t * h * d), v(t * h * d);
    for (dim i = 0; i < t * h * d; ++i) {
        k[i] = 0.05f * static_cast<float>((i * 7) % 23) - 0.5f;
        v[i] = 0.25f * static_cast<float>((i * 5) % 19) - 2.f;
    }
    std::vector<uint8_t> kc(cache_md.get_size(), 0), vc(cache_md.get_size(), 0);
    std::vector<float> ks(nb * h * bs, 1.f), vs(nb * h * bs, 1.f);
    reshape_and_cache(rpd).execute(
            s, { { ARG_KEY, tensor(tensor_desc({ t, h, d }, data_type::f32), k.data()) },
                 { ARG_VALUE, tensor(tensor_desc({ t, h, d }, data_type::f32), v.data()) },
                 { ARG_K_CACHE, tensor(cache_md, kc.data()) },
                 { ARG_V_CACHE, tensor(cache_md, vc.data()) },
                 { ARG_SLOT_MAPPING, tensor(tensor_desc({ t }, data_type::s64), slots.data()) },
                 { ARG_K_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), ks.data()) },
                 { ARG_V_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), vs.data()) } });

    std::vector<float> q(2 * hq * d), dst(2 * hq * d, -1.f);
    for (dim i = 0; i < 2 * hq * d; ++i)
        q[i] = 0.1f * static_cast<float>((i * 3) % 13) - 0.6f;
    std::vector<int32_t> table { 2, 0, 1, 0 }, seq_lens { 1, 3 }, starts { 0, 1, 2 };
    paged_attention(ppd).execute(
            s, { { ARG_QUERY, tensor(tensor_desc({ 2, hq, d }, data_type::f32), q.data()) },
                 { ARG_DST, tensor(tensor_desc({ 2, hq, d }, data_type::f32), dst.data()) },
                 { ARG_K_CACHE, tensor(cache_md, kc.data()) },
                 { ARG_V_CACHE, tensor(cache_md, vc.data()) },
                 { ARG_BLOCK_TABLE, tensor(tensor_desc({ 2, 2 }, data_type::s32), table.data()) },
                 { ARG_SEQ_LENS, tensor(tensor_desc({ 2 }, data_type::s32), seq_lens.data()) },
                 { ARG_QUERY_START_LOC, tensor(tensor_desc({ 3 }, data_type::s32), starts.data()) },
                 { ARG_K_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), ks.data()) },
                 { ARG_V_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), vs.data()) } });
    s.wait();

    // Dequantized value of token ti, head hi, as the reference codec defines it.
    auto dequant = [&](const std::vector<float> &x, dim ti, dim hi, dim di) {
        float amax = 0.f;
        for (dim j = 0; j < d; ++j)
            amax = std::max(amax, std::fabs(x[(ti * h + hi) * d + j]));
        const float scale = std::max(amax / 448.f, FLT_MIN);
        const float xs = x[(ti * h + hi) * d + di] / scale;
        return reference::decode_fp8(reference::format::e4m3,
                                     reference::encode_fp8_slow(reference::format::e4m3, xs)) *
               scale;
    };
    const std::vector<std::vector<dim>> tokens_of_seq { { 0 }, { 1, 2, 3 } };
    const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (dim seq = 0; seq < 2; ++seq)
        for (dim qh = 0; qh < hq; ++qh) {
            const dim kvh = qh / (hq / h);
            std::vector<double> score;
            for (dim tok : tokens_of_seq[seq]) {
                double dot = 0;
                for (dim di = 0; di < d; ++di)
                    dot += static_cast<double>(q[(seq * hq + qh) * d + di]) * dequant(k, tok, kvh, di);
                score.push_back(dot * softmax_scale);
            }
            const double m = *std::max_element(score.begin(), score.end());
            double sum = 0;
            for (double &x : score)
                sum += (x = std::exp(x - m));
            for (dim di = 0; di < d; ++di) {
                double out = 0;
                for (size_t j = 0; j < score.size(); ++j)
                    out += score[j] / sum * dequant(v, tokens_of_seq[seq][j], kvh, di);
                ASSERT_NEAR(dst[(seq * hq + qh) * d + di], out, 1e-4 + 1e-4 * std::fabs(out))
                        << "sequence " << seq << " head " << qh << " dim " << di;
            }
        }
}

} // namespace
