// The AMX tile emulator (src/x64/amx_tiles.hpp), which stands in for the hardware wherever x64:amx is
// built with PAGEDATTN_AMX_EMULATOR, against the rules it claims to keep:
//  - TDPBF16PS against the test's own scalar products: exact where every sum is exact, within f32
//    rounding of an fp64 product sum on random data, and the architecture's special rules (bf16
//    denormal inputs read as zero, denormal results flushed, each row's even and odd products summed
//    apart before they are added to C, round to nearest even whatever MXCSR says);
//  - loads and stores move exactly the configured rows x bytes, and the rest of a tile is zero;
//  - every shape violation the hardware faults on aborts with a message naming it;
//  - on a host with AMX, the hardware backend gives the emulator's bits on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "src/x64/amx_tiles.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace {

namespace tiles = pagedattn::detail::amx_tiles;

uint16_t bf16_bits(float x) { // x must be exact in bf16
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    EXPECT_EQ(bits & 0xFFFFu, 0u) << x << " is not exact in bf16";
    return static_cast<uint16_t>(bits >> 16);
}
double bf16_value(uint16_t bits) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &wide, 4);
    return x;
}

tiles::tile_config full_config() {
    tiles::tile_config c;
    for (int t = 0; t < tiles::tile_count; ++t)
        c.set(t, 16, 64);
    return c;
}

/// One product C (16 x 16 f32) += A (16 x 32 bf16) x B (16 rows of 16 bf16 pairs) on tiles 0, 1, 2.
struct product {
    std::vector<uint16_t> a = std::vector<uint16_t>(16 * 32), b = std::vector<uint16_t>(16 * 32);
    std::vector<float> c = std::vector<float>(16 * 16);

    template <typename Backend> std::vector<float> run(Backend &t) const {
        std::vector<float> out(c);
        t.configure(full_config());
        t.template load<0>(out.data(), 64);
        t.template load<1>(a.data(), 64);
        t.template load<2>(b.data(), 64);
        t.template dpbf16ps<0, 1, 2>();
        t.template store<0>(out.data(), 64);
        t.release();
        return out;
    }
    /// fp64: C + sum_k of both products (no rounding), and sum |terms| for the error bound.
    void exact(int m, int n, double &sum, double &magnitude) const {
        sum = c[static_cast<size_t>(m * 16 + n)];
        magnitude = std::fabs(sum);
        for (int k = 0; k < 16; ++k)
            for (int i = 0; i < 2; ++i) {
                const double p = bf16_value(a[static_cast<size_t>(m * 32 + 2 * k + i)]) *
                                 bf16_value(b[static_cast<size_t>(k * 32 + 2 * n + i)]);
                sum += p;
                magnitude += std::fabs(p);
            }
    }
};

TEST(amx_emulator, small_integer_products_are_exact) {
    std::mt19937 gen(7);
    std::uniform_int_distribution<int> small(-8, 8);
    product p;
    for (auto &x : p.a)
        x = bf16_bits(static_cast<float>(small(gen)));
    for (auto &x : p.b)
        x = bf16_bits(static_cast<float>(small(gen)));
    for (auto &x : p.c)
        x = static_cast<float>(small(gen) * 100);
    tiles::emulated_tiles t;
    const std::vector<float> out = p.run(t);
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) {
            double sum, magnitude;
            p.exact(m, n, sum, magnitude);
            EXPECT_EQ(out[static_cast<size_t>(m * 16 + n)], sum) << "C[" << m << "][" << n << "]";
        }
}

TEST(amx_emulator, random_products_are_within_f32_rounding_of_fp64) {
    std::mt19937 gen(11);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto random_bf16 = [&] { // a normal variate truncated to bf16
        float x = normal(gen);
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        return static_cast<uint16_t>(bits >> 16);
    };
    for (int trial = 0; trial < 8; ++trial) {
        product p;
        for (auto &x : p.a)
            x = random_bf16();
        for (auto &x : p.b)
            x = random_bf16();
        for (auto &x : p.c)
            x = normal(gen);
        tiles::emulated_tiles t;
        const std::vector<float> out = p.run(t);
        for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 16; ++n) {
                double sum, magnitude;
                p.exact(m, n, sum, magnitude);
                // 16 rounded steps per chain, one for the pair sum, one for C: 18 units of 2^-24.
                EXPECT_NEAR(out[static_cast<size_t>(m * 16 + n)], sum, 18 * 0x1p-24 * magnitude)
                        << "trial " << trial << " C[" << m << "][" << n << "]";
            }
    }
}

// One element: C[0][0] = c + sum of the pairs given for k = 0..K-1, all else zero.
float one_element(float c, const std::vector<std::pair<float, float>> &even,
                  const std::vector<std::pair<float, float>> &odd) {
    product p;
    std::fill(p.a.begin(), p.a.end(), 0);
    std::fill(p.b.begin(), p.b.end(), 0);
    std::fill(p.c.begin(), p.c.end(), 0.f);
    p.c[0] = c;
    for (size_t k = 0; k < even.size(); ++k) {
        p.a[2 * k] = bf16_bits(even[k].first);
        p.b[k * 32] = bf16_bits(even[k].second);
    }
    for (size_t k = 0; k < odd.size(); ++k) {
        p.a[2 * k + 1] = bf16_bits(odd[k].first);
        p.b[k * 32 + 1] = bf16_bits(odd[k].second);
    }
    tiles::emulated_tiles t;
    return p.run(t)[0];
}

TEST(amx_emulator, even_and_odd_products_are_summed_before_c) {
    // 1 + 2^-24 + 2^-24: added to C one at a time each ties back to 1; summed first they give 2^-23.
    EXPECT_EQ(one_element(1.f, { { 0x1p-24f, 1.f } }, { { 0x1p-24f, 1.f } }), 1.f + 0x1p-23f);
    // Within the even chain the steps round one by one: 1 + 2^-24 ties to 1, twice.
    EXPECT_EQ(one_element(0.f, { { 1.f, 1.f }, { 0x1p-24f, 1.f }, { 0x1p-24f, 1.f } }, {}), 1.f);
}

TEST(amx_emulator, denormal_inputs_read_as_zero) {
    uint16_t denormal_bits = 0x0040; // bf16 2^-127: a denormal
    const float denormal = static_cast<float>(bf16_value(denormal_bits));
    ASSERT_EQ(std::fpclassify(denormal), FP_SUBNORMAL);
    EXPECT_EQ(one_element(0.f, { { denormal, 0x1p100f } }, {}), 0.f); // not 2^-27
    EXPECT_EQ(one_element(0.f, {}, { { 0x1p100f, denormal } }), 0.f);
}

TEST(amx_emulator, denormal_results_are_flushed_to_zero) {
    // 2^-70 * 2^-60 = 2^-130 is denormal in f32: flushed, whatever its sign.
    EXPECT_EQ(one_element(0.f, { { 0x1p-70f, 0x1p-60f } }, {}), 0.f);
    EXPECT_EQ(one_element(0.f, { { -0x1p-70f, 0x1p-60f } }, {}), 0.f);
    // Flushed at each step of the chain: 16 products of 2^-127 (each denormal) would sum to the
    // normal 2^-123; flushed one by one they stay zero.
    std::vector<std::pair<float, float>> tiny(16, { 0x1p-70f, 0x1p-57f });
    EXPECT_EQ(one_element(0.f, tiny, {}), 0.f);
    // A normal result is kept: 2^-63 * 2^-63 = 2^-126.
    EXPECT_EQ(one_element(0.f, { { 0x1p-63f, 0x1p-63f } }, {}), 0x1p-126f);
}

#if defined(__x86_64__) || defined(__i386__)
TEST(amx_emulator, rounds_to_nearest_even_whatever_mxcsr_says) {
    const float expected = one_element(1.f, { { 0x1p-24f, 3.f } }, {}); // 1 + 3 * 2^-24: nearest is 1 + 2^-22
    EXPECT_EQ(expected, 1.f + 0x1p-22f);
    const unsigned saved = _mm_getcsr();
    const unsigned round_down_ftz_daz = (saved & ~0x6000u) | 0x2000u | 0x8040u;
    _mm_setcsr(round_down_ftz_daz);
    const float got = one_element(1.f, { { 0x1p-24f, 3.f } }, {});
    const unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    EXPECT_EQ(got, expected) << "the caller's rounding mode leaked into the products";
    EXPECT_EQ(after, round_down_ftz_daz) << "the caller's MXCSR was not restored";
}
#endif

TEST(amx_emulator, loads_and_stores_move_the_configured_shape_only) {
    tiles::tile_config config;
    config.set(3, 5, 12); // 5 rows x 12 bytes
    tiles::emulated_tiles t;
    t.configure(config);
    std::vector<uint8_t> source(16 * 100);
    for (size_t i = 0; i < source.size(); ++i)
        source[i] = static_cast<uint8_t>(i % 251 + 1);
    t.load<3>(source.data(), 100);
    std::vector<uint8_t> out(16 * 80, 0xEE);
    t.store<3>(out.data(), 80);
    for (int r = 0; r < 16; ++r)
        for (int i = 0; i < 80; ++i) {
            const uint8_t want = r < 5 && i < 12 ? source[static_cast<size_t>(r * 100 + i)] : 0xEE;
            ASSERT_EQ(out[static_cast<size_t>(r * 80 + i)], want) << "row " << r << " byte " << i;
        }
    t.zero<3>();
    t.store<3>(out.data(), 80);
    for (int r = 0; r < 5; ++r)
        for (int i = 0; i < 12; ++i)
            ASSERT_EQ(out[static_cast<size_t>(r * 80 + i)], 0) << "row " << r << " byte " << i;
}

TEST(amx_emulator, a_product_reads_only_the_configured_columns) {
    // C and B 4 rows x 8 bytes (2 f32 / 2 bf16 pairs), A 4 rows x 12 bytes (K = 3): a narrower
    // shape than the buffers, whose other bytes are NaN.
    tiles::tile_config config;
    config.set(0, 4, 8);
    config.set(1, 4, 12);
    config.set(2, 3, 8);
    std::vector<uint16_t> a(4 * 32, 0x7FC0), b(3 * 32, 0x7FC0);
    std::vector<float> c(4 * 16, NAN);
    for (int m = 0; m < 4; ++m) {
        for (int n = 0; n < 2; ++n)
            c[static_cast<size_t>(m * 16 + n)] = static_cast<float>(m);
        for (int k = 0; k < 6; ++k)
            a[static_cast<size_t>(m * 32 + k)] = bf16_bits(static_cast<float>(k + 1));
    }
    for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 4; ++j)
            b[static_cast<size_t>(k * 32 + j)] = bf16_bits(static_cast<float>(j + 1));
    tiles::emulated_tiles t;
    t.configure(config);
    t.load<0>(c.data(), 64);
    t.load<1>(a.data(), 64);
    t.load<2>(b.data(), 64);
    t.dpbf16ps<0, 1, 2>();
    std::vector<float> out(4 * 16, -1.f);
    t.store<0>(out.data(), 64);
    for (int m = 0; m < 4; ++m)
        for (int n = 0; n < 2; ++n) {
            double want = m;
            for (int k = 0; k < 3; ++k)
                want += (2 * k + 1) * (2 * n + 1) + (2 * k + 2) * (2 * n + 2);
            EXPECT_EQ(out[static_cast<size_t>(m * 16 + n)], want) << m << ", " << n;
            EXPECT_EQ(out[static_cast<size_t>(m * 16 + 2)], -1.f) << "stored beyond colsb";
        }
}

// Each violation aborts with a message naming the instruction and the rule.

TEST(amx_emulator_death, using_a_tile_without_a_configuration) {
    std::vector<uint8_t> buffer(1024);
    EXPECT_DEATH(
            {
                tiles::emulated_tiles t;
                t.load<0>(buffer.data(), 64);
            },
            "TILELOADD on tile 0: no tile configuration is loaded");
    EXPECT_DEATH(
            {
                tiles::emulated_tiles t;
                t.configure(full_config());
                t.release();
                t.zero<1>();
            },
            "TILEZERO on tile 1: no tile configuration is loaded");
}

TEST(amx_emulator_death, using_an_unconfigured_tile) {
    tiles::tile_config config;
    config.set(0, 16, 64);
    std::vector<uint8_t> buffer(1024);
    EXPECT_DEATH(
            {
                tiles::emulated_tiles t;
                t.configure(config);
                t.store<5>(buffer.data(), 64);
            },
            "TILESTORED on tile 5: the tile is not configured");
}

TEST(amx_emulator_death, bad_configurations) {
    auto configure = [](tiles::tile_config c) {
        tiles::emulated_tiles t;
        t.configure(c);
    };
    tiles::tile_config c = full_config();
    c.palette_id = 0;
    EXPECT_DEATH(configure(c), "LDTILECFG.*palette 0 is not palette 1");
    c = full_config();
    c.set(2, 17, 64);
    EXPECT_DEATH(configure(c), "LDTILECFG on tile 2: 17 rows x 64 bytes exceeds 16 x 64");
    c = full_config();
    c.set(4, 16, 68);
    EXPECT_DEATH(configure(c), "LDTILECFG on tile 4: 16 rows x 68 bytes exceeds 16 x 64");
    c = full_config();
    c.set(8, 1, 4);
    EXPECT_DEATH(configure(c), "LDTILECFG on tile 8: palette 1 has tiles 0-7 only");
    c = full_config();
    c.set(6, 0, 64);
    EXPECT_DEATH(configure(c), "LDTILECFG on tile 6: 0 rows x 64 bytes");
}

TEST(amx_emulator_death, products_of_mismatched_shapes) {
    auto multiply = [](tiles::tile_config c) {
        tiles::emulated_tiles t;
        t.configure(c);
        t.dpbf16ps<0, 1, 2>();
    };
    tiles::tile_config c = full_config();
    c.set(1, 8, 64); // A 8 rows, C 16
    EXPECT_DEATH(multiply(c), "TDPBF16PS on tile 1: A has 8 rows, C 16");
    c = full_config();
    c.set(2, 8, 64); // B 8 rows, A's 64 bytes need 16
    EXPECT_DEATH(multiply(c), "TDPBF16PS on tile 2: B has 8 rows, A's 64 bytes per row need 16");
    c = full_config();
    c.set(2, 16, 32); // B 32 bytes per row, C 64
    EXPECT_DEATH(multiply(c), "TDPBF16PS on tile 2: B has 32 bytes per row, C 64");
    c = full_config();
    c.set(0, 16, 30); // C rows not whole dwords
    EXPECT_DEATH(multiply(c), "TDPBF16PS on tile 0: C and A rows must hold whole dwords");
}

TEST(amx_hardware, gives_the_emulators_bits) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (pagedattn::get_host_cpu_isa() < pagedattn::cpu_isa::amx)
        GTEST_SKIP() << "the host has no AMX (or Linux did not grant tile data): nothing to compare";
    std::mt19937 gen(13);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int trial = 0; trial < 16; ++trial) {
        product p;
        for (auto &x : p.a) {
            float f = normal(gen);
            uint32_t bits;
            std::memcpy(&bits, &f, 4);
            x = static_cast<uint16_t>(bits >> 16);
        }
        for (auto &x : p.b)
            x = static_cast<uint16_t>(gen() & 0xFFFF); // every bit pattern: denormals, inf, NaN
        for (auto &x : p.c)
            x = normal(gen);
        tiles::emulated_tiles emulated;
        tiles::hardware_tiles hardware;
        const std::vector<float> want = p.run(emulated), got = p.run(hardware);
        for (size_t i = 0; i < want.size(); ++i) {
            if (std::isnan(want[i]) && std::isnan(got[i])) continue; // NaN payloads may differ
            EXPECT_EQ(got[i], want[i]) << "trial " << trial << " element " << i;
        }
    }
#else
    GTEST_SKIP() << "built without -mamx-tile -mamx-bf16: no hardware backend";
#endif
}

} // namespace
