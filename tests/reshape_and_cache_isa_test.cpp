// The vectorised reshape_and_cache implementations (x64:avx512, x64:avx2) against ref:any, bit for bit:
//   1. their row encoders against the scalar codec of src/fp8.hpp (itself checked exhaustively against
//      an independent fp64 encoder in fp8_codec_test.cpp) over every bf16 and f16 value, random f32
//      bit patterns and dense sweeps around every rounding boundary;
//   2. every implementation the host runs (the list walked with next_impl()) writes the same cache
//      bytes and per-token scales as ref:any over every cache type, input type, layout and scales mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "primitives/reshape_and_cache/reshape_and_cache_internal.hpp"
#include "src/fp8.hpp"

namespace {

using namespace pagedattn;

bool reduced() {
    const char *e = std::getenv("PAGEDATTN_TEST_REDUCED");
    return e != nullptr && std::string(e) == "1";
}

uint32_t bits_of(float x) {
    return detail::float_bits(x);
}
float float_of(uint32_t u) {
    return detail::bits_float(u);
}

const char *dt_str(data_type dt) {
    return data_type_name(dt);
}

// ---------------------------------------------------------------------------------------------
// 1. The row encoders

// Values x with x - 4 ulps .. x + 4 ulps appended (both signs), for every boundary x.
void add_sweep(std::vector<float> &out, float x) {
    const uint32_t b = bits_of(std::fabs(x));
    for (int k = -4; k <= 4; ++k) {
        const int64_t m = static_cast<int64_t>(b) + k;
        if (m < 0 || m > 0x7FFFFFFF) continue;
        out.push_back(float_of(static_cast<uint32_t>(m)));
        out.push_back(-float_of(static_cast<uint32_t>(m)));
    }
}

// `scale`: the FP8 boundaries are swept around boundary * scale, so that x / scale lands on both
// sides of them (a reciprocal multiply instead of the division shows there).
std::vector<float> encoder_inputs(float scale) {
    std::vector<float> in;
    // Every bf16 value and every f16 value, as f32 (NaN payload classes of both included).
    for (uint32_t h = 0; h < 0x10000; ++h) {
        in.push_back(detail::bf16_to_f32(static_cast<uint16_t>(h)));
        in.push_back(detail::f16_to_f32(static_cast<uint16_t>(h)));
    }
    // Random f32 bit patterns.
    std::mt19937 rng(20240607);
    const int random_count = reduced() ? 100000 : 1000000;
    for (int i = 0; i < random_count; ++i)
        in.push_back(float_of(static_cast<uint32_t>(rng())));
    // Around every FP8 code and every midpoint between neighbouring codes (ties, their neighbours and
    // the carries into the exponent), and past the largest finite value (max + ulp / 2 and beyond).
    for (data_type dt : { data_type::f8_e4m3, data_type::f8_e5m2 }) {
        const auto decode = dt == data_type::f8_e4m3 ? detail::decode_e4m3 : detail::decode_e5m2;
        const int max_code = dt == data_type::f8_e4m3 ? 0x7E : 0x7B;
        for (int c = 0; c <= max_code; ++c) {
            const float lo = decode(static_cast<uint8_t>(c));
            const float hi = c < max_code ? decode(static_cast<uint8_t>(c + 1))
                                          : lo + (lo - decode(static_cast<uint8_t>(c - 1)));
            add_sweep(in, lo * scale);
            add_sweep(in, (lo + hi) / 2 * scale); // the midpoint is exact: small-mantissa values
            add_sweep(in, hi * scale);
        }
    }
    // Around every f16 and bf16 midpoint (the tie cases of those encoders), and the f16 overflow.
    for (uint32_t h = 0; h < 0x7C00; ++h) {
        const double lo = detail::f16_to_f32(static_cast<uint16_t>(h));
        const double hi = h + 1 < 0x7C00 ? detail::f16_to_f32(static_cast<uint16_t>(h + 1)) : 65536.0;
        add_sweep(in, static_cast<float>((lo + hi) / 2));
    }
    for (uint32_t h = 0; h < 0x7F80; h += reduced() ? 7 : 1)
        add_sweep(in, float_of((h << 16) | 0x8000));
    // Specials: zeros, infinities, quiet and signalling NaNs with payloads in every bit range, the f32
    // extremes and subnormals.
    for (uint32_t u : { 0x00000000u, 0x7F800000u, 0x7F800001u, 0x7F801FFFu, 0x7F802000u, 0x7F9FFFFFu,
                        0x7FA00000u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u, 0x7FE00000u, 0x7FFFFFFFu,
                        0x7F7FFFFFu, 0x00800000u, 0x00000001u, 0x007FFFFFu, 0x00400000u }) {
        in.push_back(float_of(u));
        in.push_back(float_of(u | 0x80000000u));
    }
    return in;
}

// What src/fp8.hpp's scalar codec stores for x in cache type dt (FP8: of x / scale). For an f32
// cache the library quiets a signalling NaN, as ref:any's conversion of the input row (x * 1.f) does.
std::vector<uint8_t> scalar_encode(const std::vector<float> &in, float scale, data_type dt) {
    const size_t es = data_type_size(dt);
    std::vector<uint8_t> out(in.size() * es);
    for (size_t i = 0; i < in.size(); ++i) {
        float x = in[i];
        if (detail::is_fp8(dt)) x = x / scale;
        if (dt == data_type::f32 && std::isnan(x)) x = float_of(bits_of(x) | 0x00400000u);
        detail::store_from_f32(out.data(), dt, static_cast<int64_t>(i), x);
    }
    return out;
}

// Scales for the FP8 row encoders: 2e36, whose 2^8 multiple overflows f32 (e4m3 then divides by
// the scale and multiplies by 2^-8); FLT_MIN; per-token scales amax / max of both formats; and
// log-uniform random scales (the boundary sweeps follow each scale).
std::vector<float> fp8_scales() {
    std::vector<float> v { 1.f, 0.037f, 5.3f, FLT_MIN, 2e36f };
    for (float amax : { 1e-3f, 0.7f, 3.f, 300.f, 6e4f })
        for (float fmax : { 448.f, 57344.f })
            v.push_back(amax / fmax);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-70.f, 90.f);
    for (int i = 0; i < (reduced() ? 3 : 12); ++i)
        v.push_back(std::exp2(exponent(rng)));
    return v;
}

struct isa_case {
    cpu_isa isa;
    const char *name;
};

class row_encoder_test : public testing::TestWithParam<isa_case> {};

TEST_P(row_encoder_test, bit_identical_to_scalar_codec) {
    const isa_case c = GetParam();
    const detail::row_encoder encode = detail::reshape_and_cache_row_encoder(c.isa);
    if (encode == nullptr) GTEST_SKIP() << "the library was built without the x64 kernels";
    if (static_cast<int>(get_host_cpu_isa()) < static_cast<int>(c.isa))
        GTEST_SKIP() << "the host does not run " << c.name;
    for (data_type dt :
         { data_type::f8_e4m3, data_type::f8_e5m2, data_type::bf16, data_type::f16, data_type::f32 }) {
        const std::vector<float> scales = detail::is_fp8(dt) ? fp8_scales() : std::vector<float> { 1.f };
        for (float scale : scales) {
            const std::vector<float> in = encoder_inputs(scale);
            SCOPED_TRACE(std::string(dt_str(dt)) + " scale " + std::to_string(scale));
            const std::vector<uint8_t> expected = scalar_encode(in, scale, dt);
            const size_t es = data_type_size(dt);
            // An odd length, so that the tail path runs too; a guard byte after the row.
            std::vector<uint8_t> actual(expected.size() + 1, 0xA5);
            encode(in.data(), static_cast<int64_t>(in.size()), scale, dt, actual.data());
            EXPECT_EQ(actual.back(), 0xA5) << "wrote past the row";
            size_t mismatches = 0;
            for (size_t i = 0; i < in.size(); ++i) {
                if (std::memcmp(&actual[i * es], &expected[i * es], es) == 0) continue;
                if (mismatches++ < 8) {
                    uint32_t a = 0, x = 0;
                    std::memcpy(&a, &actual[i * es], es);
                    std::memcpy(&x, &expected[i * es], es);
                    ADD_FAILURE() << "input 0x" << std::hex << bits_of(in[i]) << " (" << in[i] << "): got 0x"
                                  << a << ", expected 0x" << x << std::dec;
                }
            }
            EXPECT_EQ(mismatches, 0u) << "of " << in.size() << " inputs";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(x64, row_encoder_test,
                         testing::Values(isa_case { cpu_isa::avx512, "avx512" },
                                         isa_case { cpu_isa::avx2, "avx2" }),
                         [](const testing::TestParamInfo<isa_case> &info) {
                             return std::string(info.param.name);
                         });

// ---------------------------------------------------------------------------------------------
// 2. Every implementation against ref:any, end to end

enum class cache_kind { hnd_padded, nhd, packed, any };

const char *kind_str(cache_kind k) {
    switch (k) {
        case cache_kind::hnd_padded: return "hnd_padded";
        case cache_kind::nhd: return "nhd";
        case cache_kind::packed: return "packed";
        case cache_kind::any: return "any";
    }
    return "?";
}

struct e2e_case {
    data_type cache_dt, key_dt, value_dt;
    cache_kind kind;
    int k_mask, v_mask; // -1: none
    dim t, h, d, bs, nb;
    bool slots32;
    bool finite = false; // inputs without NaN and inf (the x64 kernels' finite bf16 groups skip the clamp)
    float k_scale = 0.037f, v_scale = 5.3f; // the scales not per token (per head: varied around them)
};

std::string case_name(const e2e_case &c) {
    return std::string(dt_str(c.key_dt)) + "/" + dt_str(c.value_dt) + "_to_" + dt_str(c.cache_dt) + "_" +
           kind_str(c.kind) + "_k" + std::to_string(c.k_mask) + "_v" + std::to_string(c.v_mask) + "_t" +
           std::to_string(c.t) + "_h" + std::to_string(c.h) + "_d" + std::to_string(c.d) + "_bs" +
           std::to_string(c.bs) + (c.slots32 ? "_s32" : "_s64") + (c.finite ? "_finite" : "");
}

// A [T, H, D] input with padded token and head strides: values from a pool of ordinary numbers, +-300
// outliers, NaN, +-inf, tiny values (subnormal in f32 and in the FP8 formats after scaling), whole
// zero rows, a whole NaN/inf row, and raw random bit patterns (signalling NaNs among them).
struct input_tensor {
    data_type dt;
    dim t, h, d, token_stride, head_stride;
    std::vector<uint8_t> bytes;
    tensor as_tensor() const {
        return tensor(tensor_desc({ t, h, d }, dt, { token_stride, head_stride, 1 }), bytes.data());
    }
};

// finite: the same kinds of rows and values without NaN and inf (ordinary values in their place).
input_tensor make_input(data_type dt, dim t, dim h, dim d, std::mt19937 &rng, bool finite = false) {
    input_tensor in { dt, t, h, d, h * (d + 3) + 5, d + 3, {} };
    const size_t es = data_type_size(dt);
    const dim extent = t == 0 ? 1 : (t - 1) * in.token_stride + (h - 1) * in.head_stride + d;
    in.bytes.assign(static_cast<size_t>(extent) * es, 0x5A);
    std::uniform_real_distribution<float> uni(-4.f, 4.f);
    std::uniform_int_distribution<int> kind(0, 99);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (dim ti = 0; ti < t; ++ti)
        for (dim hi = 0; hi < h; ++hi) {
            const int row_kind = static_cast<int>((ti * 7 + hi * 3) % 11);
            for (dim di = 0; di < d; ++di) {
                float x;
                bool raw = false, snan = false;
                int k = kind(rng);
                if (finite && k >= 3 && k < 7) k = 99;  // NaN and inf: ordinary values
                if (finite && k >= 9 && k < 13) k = 99; // raw bits, signalling NaNs: too
                if (row_kind == 0)
                    x = 0.f; // an all-zero row: per-token scale FLT_MIN
                else if (row_kind == 1 && !finite)
                    x = di % 3 == 0 ? nan : di % 3 == 1 ? inf : -inf; // amax of nothing finite
                else if (row_kind == 2)
                    x = uni(rng) * 1e-38f; // tiny row: f32 subnormals and the scale floor
                else if (k < 3)
                    x = k == 0 ? 300.f : k == 1 ? -300.f : 1e5f;
                else if (k < 5)
                    x = k == 3 ? nan : -nan;
                else if (k < 7)
                    x = k == 5 ? inf : -inf;
                else if (k < 9)
                    x = uni(rng) * 1e-6f;
                else if (k < 11)
                    raw = true, x = 0.f;
                else if (k < 13)
                    snan = true, x = 0.f;
                else
                    x = uni(rng);
                uint8_t *p = in.bytes.data() + (ti * in.token_stride + hi * in.head_stride + di) * es;
                uint32_t r = static_cast<uint32_t>(rng());
                if (snan) { // a signalling NaN of the input type, either sign, a random payload
                    raw = true;
                    if (dt == data_type::f32)
                        r = (r & 0x80000000u) | 0x7F800000u | ((r & 0x3FFFFFu) | 1u);
                    else if (dt == data_type::bf16)
                        r = (r & 0x8000u) | 0x7F80u | ((r & 0x3Fu) | 1u);
                    else
                        r = (r & 0x8000u) | 0x7C00u | ((r & 0x1FFu) | 1u);
                }
                if (dt == data_type::f32) {
                    const uint32_t u = raw ? r : bits_of(x);
                    std::memcpy(p, &u, 4);
                } else {
                    const uint16_t u = raw                     ? static_cast<uint16_t>(r)
                                       : dt == data_type::bf16 ? detail::f32_to_bf16(x)
                                                               : detail::f32_to_f16(x);
                    std::memcpy(p, &u, 2);
                }
            }
        }
    return in;
}

tensor_desc cache_desc(const e2e_case &c) {
    const dims x { c.nb, c.h, c.bs, c.d };
    switch (c.kind) {
        case cache_kind::hnd_padded: {
            const dim ts = c.d + 8, hs = c.bs * ts + 4;
            return tensor_desc(x, c.cache_dt, { c.h * hs + 12, hs, ts, 1 });
        }
        case cache_kind::nhd: return tensor_desc(x, c.cache_dt, { c.bs * c.h * c.d, c.d, c.h * c.d, 1 });
        case cache_kind::packed: return tensor_desc(x, c.cache_dt, layout::packed);
        case cache_kind::any: return tensor_desc(x, c.cache_dt, layout::any);
    }
    return {};
}

tensor_desc scales_md(const e2e_case &c, int mask) {
    if (mask == scales_per_tensor) return tensor_desc({ 1 }, data_type::f32);
    if (mask == scales_per_kv_head) return tensor_desc({ c.h }, data_type::f32);
    return tensor_desc({ c.nb, c.h, c.bs }, data_type::f32);
}

std::vector<float> make_scales(const e2e_case &c, int mask, float base) {
    if (mask == scales_per_tensor) return { base };
    if (mask == scales_per_kv_head) {
        std::vector<float> v(static_cast<size_t>(c.h));
        for (dim i = 0; i < c.h; ++i)
            v[static_cast<size_t>(i)] = base * (1.f + 0.37f * static_cast<float>(i));
        return v;
    }
    if (mask == scales_per_token) return std::vector<float>(static_cast<size_t>(c.nb * c.h * c.bs), -7.f);
    return {};
}

struct outputs {
    std::vector<uint8_t> k_cache, v_cache;
    std::vector<float> k_scales, v_scales;
};

struct inputs {
    input_tensor key, value;
    std::vector<int64_t> slots64;
    std::vector<int32_t> slots32;
};

// A permutation of the slots with negative entries (skipped) and tokens sharing a slot (the later
// one is stored).
inputs make_inputs(const e2e_case &c, std::mt19937 &rng) {
    inputs in { make_input(c.key_dt, c.t, c.h, c.d, rng, c.finite),
                make_input(c.value_dt, c.t, c.h, c.d, rng, c.finite),
                {},
                {} };
    std::vector<int64_t> all(static_cast<size_t>(c.nb * c.bs));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    in.slots64.assign(all.begin(), all.begin() + c.t);
    for (dim i = 3; i < c.t; i += 7)
        in.slots64[static_cast<size_t>(i)] = -1;
    for (dim i = 5; i + 4 < c.t; i += 9)
        in.slots64[static_cast<size_t>(i + 4)] = in.slots64[static_cast<size_t>(i)];
    in.slots64.push_back(0); // non-null data even for T = 0
    in.slots32.assign(in.slots64.begin(), in.slots64.end());
    return in;
}

outputs run(const reshape_and_cache::primitive_desc &pd, const e2e_case &c, const inputs &in) {
    const tensor_desc k_md = pd.query_md(ARG_K_CACHE), v_md = pd.query_md(ARG_V_CACHE);
    outputs o { std::vector<uint8_t>(k_md.get_size(), 0xA5), std::vector<uint8_t>(v_md.get_size(), 0xA5),
                make_scales(c, c.k_mask, c.k_scale), make_scales(c, c.v_mask, c.v_scale) };
    const void *slots = c.slots32 ? static_cast<const void *>(in.slots32.data()) : in.slots64.data();
    exec_args args { { ARG_KEY, in.key.as_tensor() },
                     { ARG_VALUE, in.value.as_tensor() },
                     { ARG_K_CACHE, tensor(k_md, o.k_cache.data()) },
                     { ARG_V_CACHE, tensor(v_md, o.v_cache.data()) },
                     { ARG_SLOT_MAPPING,
                       tensor(tensor_desc({ c.t }, c.slots32 ? data_type::s32 : data_type::s64), slots) } };
    if (c.k_mask >= 0) args.emplace(ARG_K_SCALES, tensor(scales_md(c, c.k_mask), o.k_scales.data()));
    if (c.v_mask >= 0) args.emplace(ARG_V_SCALES, tensor(scales_md(c, c.v_mask), o.v_scales.data()));
    dnnl::stream s(pd.get_engine());
    reshape_and_cache(pd).execute(s, args);
    s.wait();
    return o;
}

void expect_same_bytes(const char *what, const std::vector<uint8_t> &actual,
                       const std::vector<uint8_t> &expected) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    size_t mismatches = 0;
    for (size_t i = 0; i < actual.size(); ++i)
        if (actual[i] != expected[i] && mismatches++ < 5)
            ADD_FAILURE() << what << " byte " << i << ": got 0x" << std::hex << int(actual[i])
                          << ", expected 0x" << int(expected[i]) << std::dec;
    EXPECT_EQ(mismatches, 0u) << what << ": mismatching bytes of " << actual.size();
}

void expect_same_floats(const char *what, const std::vector<float> &actual,
                        const std::vector<float> &expected) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    size_t mismatches = 0;
    for (size_t i = 0; i < actual.size(); ++i)
        if (bits_of(actual[i]) != bits_of(expected[i]) && mismatches++ < 5)
            ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i];
    EXPECT_EQ(mismatches, 0u) << what;
}

// Runs every implementation that accepts the case on the inputs and compares it with ref:any;
// returns the names of those that ran.
std::vector<std::string> compare_inputs_with_reference(const e2e_case &c, const inputs &in) {
    const tensor_desc cache_md = cache_desc(c);
    const reshape_and_cache::desc d(tensor_desc({ runtime_dim, c.h, c.d }, c.key_dt),
                                    tensor_desc({ runtime_dim, c.h, c.d }, c.value_dt), cache_md, cache_md);
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    primitive_attr attr;
    if (c.k_mask >= 0) attr.set_scales_mask(ARG_K_CACHE, c.k_mask);
    if (c.v_mask >= 0) attr.set_scales_mask(ARG_V_CACHE, c.v_mask);
    primitive_attr ref_attr = attr;
    ref_attr.set_max_cpu_isa(cpu_isa::generic);
    const reshape_and_cache::primitive_desc ref_pd(eng, d, ref_attr);
    EXPECT_EQ(std::string(ref_pd.impl_info_str()), "ref:any");
    const outputs expected = run(ref_pd, c, in);

    std::vector<std::string> ran;
    reshape_and_cache::primitive_desc pd(eng, d, attr);
    do {
        const std::string name = pd.impl_info_str();
        SCOPED_TRACE(name);
        ran.push_back(name);
        EXPECT_EQ(pd.query_md(ARG_K_CACHE), ref_pd.query_md(ARG_K_CACHE));
        const outputs actual = run(pd, c, in);
        expect_same_bytes("k_cache", actual.k_cache, expected.k_cache);
        expect_same_bytes("v_cache", actual.v_cache, expected.v_cache);
        expect_same_floats("k_scales", actual.k_scales, expected.k_scales);
        expect_same_floats("v_scales", actual.v_scales, expected.v_scales);
    } while (pd.next_impl());
    EXPECT_EQ(ran.back(), "ref:any");
    return ran;
}

// compare_inputs_with_reference on make_inputs' random inputs (`slots`, if given, replacing theirs).
std::vector<std::string> compare_with_reference(const e2e_case &c, uint32_t seed,
                                                const std::vector<int64_t> *slots = nullptr) {
    std::mt19937 rng(seed);
    inputs in = make_inputs(c, rng);
    if (slots) {
        in.slots64 = *slots;
        in.slots32.assign(slots->begin(), slots->end());
    }
    return compare_inputs_with_reference(c, in);
}

bool runs(cpu_isa isa) {
    return detail::reshape_and_cache_row_encoder(isa) != nullptr &&
           static_cast<int>(get_max_cpu_isa()) >= static_cast<int>(isa);
}

bool contains(const std::vector<std::string> &v, const char *s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

class every_implementation : public testing::TestWithParam<data_type> {};

// For one cache type: every (key type, value type) pairing, layout and scales mask (FP8), with head
// sizes and block sizes varying across cases.
TEST_P(every_implementation, same_bytes_as_reference) {
    const data_type cache_dt = GetParam();
    const data_type activations[] = { data_type::f32, data_type::bf16, data_type::f16 };
    std::vector<int> masks { -1 };
    if (detail::is_fp8(cache_dt)) masks = { -1, scales_per_tensor, scales_per_kv_head, scales_per_token };
    const dim head_sizes[] = { 64, 16, 128, 80, 48 };
    const dim t = reduced() ? 24 : 45;
    int n = 0;
    for (int ki = 0; ki < 3; ++ki)
        for (cache_kind kind :
             { cache_kind::hnd_padded, cache_kind::nhd, cache_kind::packed, cache_kind::any })
            for (size_t mi = 0; mi < masks.size(); ++mi, ++n) {
                const dim d = head_sizes[n % 5], bs = n % 2 ? 32 : 16;
                const e2e_case c { cache_dt,
                                   activations[ki],
                                   activations[(ki + n) % 3],
                                   kind,
                                   masks[mi],
                                   masks[(mi + 1 + static_cast<size_t>(n / 4) % 2) % masks.size()],
                                   t,
                                   n % 3 == 0 ? 1 : 3,
                                   d,
                                   bs,
                                   (t + bs - 1) / bs + 1,
                                   n % 2 == 1 };
                SCOPED_TRACE(case_name(c));
                const std::vector<std::string> ran =
                        compare_with_reference(c, 1000u + static_cast<uint32_t>(n));
                // The fast implementations take every head size that is a multiple of their width.
                EXPECT_EQ(ran.front() == "x64:avx512", runs(cpu_isa::avx512));
                EXPECT_EQ(contains(ran, "x64:avx2"), runs(cpu_isa::avx2));
            }
}

INSTANTIATE_TEST_SUITE_P(all, every_implementation,
                         testing::Values(data_type::f32, data_type::bf16, data_type::f16, data_type::f8_e4m3,
                                         data_type::f8_e5m2),
                         [](const testing::TestParamInfo<data_type> &info) {
                             return std::string(dt_str(info.param));
                         });

// Head sizes that are not a multiple of 16 (avx512 declines, avx2 takes multiples of 8), an empty
// step, and a single-token step; FP8 caches, and bf16 and f16 caches that bf16 keys and f16 values
// are copied into (x64:avx2's copy ends with 8 words).
TEST(every_implementation_edges, odd_head_sizes_and_token_counts) {
    for (data_type cache_dt : { data_type::f8_e4m3, data_type::bf16, data_type::f16 })
        for (dim d : { 24, 8, 20, 512 })
            for (dim t : { 0, 1, 9 }) {
                const bool fp8 = detail::is_fp8(cache_dt);
                const e2e_case c { cache_dt,
                                   data_type::bf16,
                                   fp8 ? data_type::f32 : data_type::f16,
                                   cache_kind::nhd,
                                   fp8 ? scales_per_token : -1,
                                   fp8 ? scales_per_kv_head : -1,
                                   t,
                                   2,
                                   d,
                                   4,
                                   4,
                                   false };
                SCOPED_TRACE(case_name(c));
                const std::vector<std::string> ran =
                        compare_with_reference(c, 77u + static_cast<uint32_t>(d + t));
                EXPECT_EQ(contains(ran, "x64:avx512"), runs(cpu_isa::avx512) && d % 16 == 0);
                EXPECT_EQ(contains(ran, "x64:avx2"), runs(cpu_isa::avx2) && d % 8 == 0);
            }
}

// Slots as a prefill writes them: runs of consecutive slots, so that 16 tokens often take 16
// consecutive slots of a block (written together by the x64 kernels: in a packed cache a whole
// 16-token group, in a plain one any 16 rows of a block) and often do not: runs starting mid-group
// and mid-block, a run crossing blocks, a group holding a skipped token, a group holding a token
// whose slot a later token takes, and groups cut where the kernel's task of 256 tokens ends. Every
// cache type, the packed layout and two plain ones, per-token and per-tensor scales for FP8.
TEST(every_implementation_groups, consecutive_slots_fill_groups) {
    const dim bs = 32, t = 300;
    std::vector<int64_t> slots;
    for (dim i = 0; i < 40; ++i) // one sequence from the start of block 0
        slots.push_back(i);
    for (dim i = 0; i < 64; ++i) // one from block 2, offset 8: whole groups from slot 80 on
        slots.push_back(2 * bs + 8 + i);
    for (dim i = 0; slots.size() < static_cast<size_t>(t); ++i) // from block 6: crosses token 256
        slots.push_back(6 * bs + i);
    slots[120] = -1;
    slots[290] = slots[140]; // token 140 is superseded
    slots.push_back(0);      // as make_inputs: one spare entry
    const dim nb = (slots[t - 1] + bs) / bs + 1;
    // Inputs: bf16 keys and f32 values, head size 128 (32 reduced); f16 keys and bf16 values, head
    // size 48 (the 16-bit rows' vectors end part-way: 48 = 32 + 16); bf16 keys and values, head size
    // 112 (80 reduced): a 64-dim part that x64:avx512 writes with 512-bit transposes, and the rest;
    // plain caches only, bf16 keys and f16 values, head size 24 (x64:avx2's rows end in 8 words).
    struct inputs {
        data_type key, value;
        dim d;
    };
    for (cache_kind kind : { cache_kind::packed, cache_kind::nhd, cache_kind::hnd_padded })
        for (const inputs in : { inputs { data_type::bf16, data_type::f32, reduced() ? 32 : 128 },
                                 inputs { data_type::f16, data_type::bf16, 48 },
                                 inputs { data_type::bf16, data_type::bf16, reduced() ? 80 : 112 },
                                 inputs { data_type::bf16, data_type::f16, 24 } })
            for (data_type cache_dt :
                 { data_type::f32, data_type::bf16, data_type::f16, data_type::f8_e4m3, data_type::f8_e5m2 })
                // FP8: per-token scales, and a per-tensor one that values exceed (saturating codes);
                // inputs with NaN and inf, and without (no group needs its codes clamped).
                for (int mask : detail::is_fp8(cache_dt)
                                        ? std::vector<int> { scales_per_token, scales_per_tensor }
                                        : std::vector<int> { -1 })
                    for (bool finite : { false, true }) {
                        if (finite && !detail::is_fp8(cache_dt)) continue;
                        if (kind == cache_kind::packed && in.d % 16 != 0) continue;
                        e2e_case c {
                            cache_dt, in.key, in.value, kind, mask, mask, t, 2, in.d, bs, nb, false
                        };
                        c.finite = finite;
                        SCOPED_TRACE(case_name(c));
                        const std::vector<std::string> ran = compare_with_reference(c, 5u, &slots);
                        EXPECT_EQ(contains(ran, "x64:avx2"), runs(cpu_isa::avx2));
                    }
}

// bf16 rows of 128 values as a [T, 8, 128] input with slots 0 .. T - 1 (T a multiple of 16: every
// 16-token group of the packed cache whole), the rows filled in order from the words (whole rows:
// a multiple of 128 words), the rows beyond them repeating them from the start.
inputs whole_group_inputs(const std::vector<uint16_t> &key_words, const std::vector<uint16_t> &value_words,
                          dim &t) {
    constexpr dim h = 8, d = 128;
    EXPECT_TRUE(key_words.size() % d == 0 && value_words.size() % d == 0);
    const size_t words = std::max(key_words.size(), value_words.size());
    const dim rows = static_cast<dim>((words + d - 1) / d);
    t = (rows + h * 16 - 1) / (h * 16) * 16;
    auto tensor_of = [&](const std::vector<uint16_t> &from) {
        input_tensor in {
            data_type::bf16, t, h, d, h * d, d, std::vector<uint8_t>(static_cast<size_t>(t * h * d) * 2)
        };
        for (size_t i = 0; i < static_cast<size_t>(t * h * d); ++i) {
            const uint16_t w = from[i % from.size()];
            std::memcpy(in.bytes.data() + 2 * i, &w, 2);
        }
        return in;
    };
    inputs in { tensor_of(key_words), tensor_of(value_words), {}, {} };
    for (dim i = 0; i <= t; ++i) // (one spare entry, as make_inputs)
        in.slots64.push_back(i < t ? i : 0);
    in.slots32.assign(in.slots64.begin(), in.slots64.end());
    return in;
}

// The same inputs with each 16 tokens' slots in reverse order: no 16 tokens take consecutive slots,
// so that each is written alone (as decode steps write them).
inputs one_by_one(inputs in) {
    for (size_t i = 0; i + 16 < in.slots64.size(); i += 16)
        std::reverse(in.slots64.begin() + static_cast<std::ptrdiff_t>(i),
                     in.slots64.begin() + static_cast<std::ptrdiff_t>(i + 16));
    in.slots32.assign(in.slots64.begin(), in.slots64.end());
    return in;
}

// x64:avx2's threshold encoder holds, made at compile time, the thresholds of every scale that
// per-token scaling makes from a bf16 amax (FLT_MIN, the floor, among them), and makes those of
// other scales (per-tensor, per-head) as it encodes. The codes are the same either way (the tests
// below): this checks that the table is not silently missed, leaving per-token rows a plan to make
// per row.
TEST(threshold_encoder, table_holds_every_per_token_scale_of_a_bf16_amax) {
    const detail::threshold_scale_check holds = detail::reshape_and_cache_threshold_scale_check();
    if (holds == nullptr) GTEST_SKIP() << "the library was built without the x64 kernels";
    if (!runs(cpu_isa::avx2)) GTEST_SKIP() << "the host does not run avx2";
    for (data_type dt : { data_type::f8_e4m3, data_type::f8_e5m2 }) {
        const float largest = dt == data_type::f8_e4m3 ? 448.f : 57344.f;
        for (int binade : { 127, 60, 0, -60, -100, -105, -110, -118, -126 })
            for (int significand = 0; significand < 128; ++significand) {
                const float amax = std::ldexp(1.f + significand / 128.f, binade);
                const float scale = std::max(amax / largest, FLT_MIN);
                EXPECT_TRUE(holds(scale, dt)) << dt_str(dt) << " amax " << amax << " scale " << scale;
            }
        for (float scale : { 0.037f, 5.3f, 1e-3f })
            EXPECT_FALSE(holds(scale, dt)) << dt_str(dt) << " scale " << scale;
    }
}

// The FP8 encoders of whole 16-token groups of bf16 rows, over every value they can meet. With
// per-token scales every row holds its amax and finite values at most it, in rows of 128: for each
// of the 128 significands of a bf16 amax, every bf16 value of either sign from the amax's binade
// down 34 binades (e5m2's subnormal codes lie 30-33 below, e4m3's 15-18; below, every code is a
// zero), and zeros. The scale amax / max has one of 128
// significands, so these rows meet every (scale, value) pair of such rows up to powers of two, in
// every binade of the codes, the subnormal ones included. amax binades: 2^0, and 2^-60 and 2^60,
// where the encoders' quotients are far from f32's limits; tiny rows whose values are subnormal in f32
// (amax 2^-110, 2^-118, 2^-126: the last two's scales are FLT_MIN, the floor of per-token scales)
// and the largest finite amaxes (2^127). With per-tensor scales (K and V: 0.037 and 5.3, 1 and
// 2^-20, 2^-100 and 3e4, 448 and 2e36) and per-head ones (8 around 0.037 and 5.3): every bf16
// word, NaNs and infinities included, saturating codes among them. Each in a packed cache and in a
// plain one (token-major), whose groups' rows are encoded in place, and with the tokens written one
// by one (each alone: the row path, which takes the threshold encoder where the table holds the
// scale, per-token ones and powers of two).
TEST(every_implementation_bf16_groups, every_value_within_its_token_scale_and_every_word) {
    for (data_type cache_dt : { data_type::f8_e4m3, data_type::f8_e5m2 }) {
        const std::vector<int> binades = { 0, -60, 60, -110, -118, -126, 127 };
        for (int amax_binade : reduced() ? std::vector<int>(binades.begin(), binades.begin() + 3) : binades) {
            std::vector<uint16_t> words;
            for (uint16_t significand = 0; significand < 128; ++significand) {
                const int amax_exponent = 127 + amax_binade;
                const uint16_t amax = static_cast<uint16_t>(amax_exponent << 7 | significand);
                std::vector<uint16_t> values;
                for (int e = std::max(amax_exponent - 34, 0); e <= amax_exponent; ++e)
                    for (uint16_t m = 0; m < 128; ++m) {
                        const uint16_t w = static_cast<uint16_t>(e << 7 | m);
                        if (w > amax) break;
                        values.push_back(w);
                        values.push_back(static_cast<uint16_t>(w | 0x8000));
                    }
                values.push_back(0);
                values.push_back(0x8000);
                for (size_t i = 0; i < values.size(); i += 127) { // rows: the amax, then 127 values
                    words.push_back(i % 254 == 0 ? amax : static_cast<uint16_t>(amax | 0x8000));
                    for (size_t j = i; j < i + 127; ++j)
                        words.push_back(values[j < values.size() ? j : j % values.size()]);
                }
            }
            // V: the same rows in the opposite order.
            std::vector<uint16_t> reversed;
            for (size_t r = words.size() / 128; r-- > 0;)
                reversed.insert(reversed.end(), words.begin() + static_cast<std::ptrdiff_t>(r * 128),
                                words.begin() + static_cast<std::ptrdiff_t>(r * 128 + 128));
            dim t = 0;
            const inputs grouped = whole_group_inputs(words, reversed, t), alone = one_by_one(grouped);
            for (const inputs *in : { &grouped, &alone })
                for (cache_kind kind : { cache_kind::packed, cache_kind::nhd }) {
                    const e2e_case c { cache_dt,
                                       data_type::bf16,
                                       data_type::bf16,
                                       kind,
                                       scales_per_token,
                                       scales_per_token,
                                       t,
                                       8,
                                       128,
                                       16,
                                       t / 16,
                                       false };
                    SCOPED_TRACE(case_name(c) + " amax 2^" + std::to_string(amax_binade) +
                                 (in == &alone ? " one by one" : ""));
                    EXPECT_EQ(contains(compare_inputs_with_reference(c, *in), "x64:avx2"),
                              runs(cpu_isa::avx2));
                }
        }
        std::vector<uint16_t> every(0x10000);
        std::iota(every.begin(), every.end(), 0);
        std::vector<uint16_t> shifted(every.begin() + 77, every.end());
        shifted.insert(shifted.end(), every.begin(), every.begin() + 77);
        dim t = 0;
        const inputs grouped = whole_group_inputs(every, shifted, t), alone = one_by_one(grouped);
        // (2e36's 2^8 multiple overflows f32: the division path then divides by it)
        struct scale_case {
            int mask;
            float k, v;
        };
        for (const scale_case &scales : { scale_case { scales_per_tensor, 0.037f, 5.3f },
                                          scale_case { scales_per_tensor, 1.f, 0x1p-20f },
                                          scale_case { scales_per_tensor, 0x1p-100f, 3e4f },
                                          scale_case { scales_per_tensor, 448.f, 2e36f },
                                          scale_case { scales_per_kv_head, 0.037f, 5.3f } })
            for (const inputs *in : { &grouped, &alone })
                for (cache_kind kind : { cache_kind::packed, cache_kind::nhd }) {
                    e2e_case c { cache_dt,
                                 data_type::bf16,
                                 data_type::bf16,
                                 kind,
                                 scales.mask,
                                 scales.mask,
                                 t,
                                 8,
                                 128,
                                 32,
                                 (t + 31) / 32,
                                 true };
                    c.k_scale = scales.k;
                    c.v_scale = scales.v;
                    SCOPED_TRACE(case_name(c) + " scales " + std::to_string(c.k_scale) + ", " +
                                 std::to_string(c.v_scale) + (in == &alone ? " one by one" : ""));
                    EXPECT_EQ(contains(compare_inputs_with_reference(c, *in), "x64:avx2"),
                              runs(cpu_isa::avx2));
                }
    }
}

} // namespace
