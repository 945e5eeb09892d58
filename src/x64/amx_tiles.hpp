// AMX tiles behind one small interface (configure, load, store, zero, dpbf16ps, release) with two
// backends, so that a kernel is written once and runs either on the hardware or, on hosts without
// AMX, on an emulator that keeps the hardware's rules:
//   hardware_tiles  the instructions themselves (files compiled with -mamx-tile -mamx-bf16);
//   emulated_tiles  portable C++: palette 1, 8 tiles of at most 16 rows x 64 bytes, every load,
//                   store and product checked against the configured shape of its tiles (a
//                   violation aborts with a message where the hardware would fault), TDPBF16PS
//                   computed as the architecture defines it (below).
// Tile numbers are template arguments: the instructions encode them.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#endif

// The emulator's products run 16 x 16 x 32 FMAs each, with data-dependent flushes: coverage
// instrumentation of them (libFuzzer builds) took 65% of the fuzzer's time and adds no path worth
// finding. AddressSanitizer still checks them.
#if defined(__clang__)
#define PAGEDATTN_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define PAGEDATTN_NO_COVERAGE
#endif

namespace pagedattn {
namespace detail {
namespace amx_tiles {

constexpr int tile_count = 8; // palette 1
constexpr int max_rows = 16, max_colsb = 64;

/// The 64-byte operand of LDTILECFG: palette, then bytes per row and rows of each tile (entries 8-15
/// must stay zero in palette 1). A tile with 0 rows and 0 bytes is unconfigured.
struct alignas(64) tile_config {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};

    void set(int tile, int tile_rows, int bytes_per_row) {
        rows[tile] = static_cast<uint8_t>(tile_rows);
        colsb[tile] = static_cast<uint16_t>(bytes_per_row);
    }
};
static_assert(sizeof(tile_config) == 64, "LDTILECFG reads 64 bytes");

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/// The instructions. GCC's _tile_loadd/_tile_dpbf16ps macros paste their tile argument into the
/// mnemonic, so they cannot take a template argument: the same instructions are written here with
/// the tile number as an immediate ("%c" prints it bare). Loads and stores clobber memory, so that
/// the compiler keeps them in order with the kernel's own stores to the buffers they read.
struct hardware_tiles {
    void configure(const tile_config &config) { _tile_loadconfig(&config); }
    template <int tile> void load(const void *base, long stride) {
        static_assert(tile >= 0 && tile < tile_count, "palette 1 has tiles 0-7");
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(tile) : "memory");
    }
    template <int tile> void store(void *base, long stride) {
        static_assert(tile >= 0 && tile < tile_count, "palette 1 has tiles 0-7");
        __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(tile) : "memory");
    }
    template <int tile> void zero() {
        static_assert(tile >= 0 && tile < tile_count, "palette 1 has tiles 0-7");
        __asm__ volatile("tilezero %%tmm%c0" ::"i"(tile));
    }
    /// c += a x b (TDPBF16PS c, a, b).
    template <int c, int a, int b> void dpbf16ps() {
        static_assert(c != a && c != b && a != b, "TDPBF16PS needs three different tiles");
        __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(c), "i"(a), "i"(b));
    }
    void release() { _tile_release(); }
};
#endif

/// The tiles in memory, with the hardware's rules checked on every operation.
///
/// TDPBF16PS, as the Intel SDM (vol. 2, TDPBF16PS, "Operation") defines it: for each row m of C
/// and each f32 column n, two f32 sums start at 0 and take, for k = 0 .. K-1, the products of the
/// even elements (A[m].bf16[2k] * B[k].bf16[2n]) and of the odd ones (A[m].bf16[2k+1] *
/// B[k].bf16[2n+1]), each as a fused multiply-add; then C[m][n] += even + odd. Every step reads
/// denormal inputs as zero (DAZ), flushes denormal results to zero (FTZ) and rounds to nearest
/// even, whatever MXCSR says (MXCSR is neither read nor written by the instruction), so the
/// emulator sets MXCSR to its default for the computation and restores the caller's after.
/// LDTILECFG zeroes every tile; a load zeroes the bytes of each row beyond colsb and the rows beyond
/// `rows`, and a product the same of C.
class emulated_tiles {
public:
    void configure(const tile_config &config) {
        if (config.palette_id != 1) fault("LDTILECFG", -1, "palette %d is not palette 1", config.palette_id);
        if (config.start_row != 0) fault("LDTILECFG", -1, "start_row %d is not 0", config.start_row);
        for (uint8_t r : config.reserved)
            if (r != 0) fault("LDTILECFG", -1, "reserved bytes 2-15 are not zero");
        for (int t = 0; t < 16; ++t) {
            const int rows = config.rows[t], colsb = config.colsb[t];
            if (t >= tile_count && (rows || colsb)) fault("LDTILECFG", t, "palette 1 has tiles 0-7 only");
            if (rows > max_rows || colsb > max_colsb)
                fault("LDTILECFG", t, "%d rows x %d bytes exceeds 16 x 64", rows, colsb);
            if ((rows == 0) != (colsb == 0)) fault("LDTILECFG", t, "%d rows x %d bytes", rows, colsb);
        }
        config_ = config;
        configured_ = true;
        std::memset(data_, 0, sizeof data_);
    }
    template <int tile> void load(const void *base, long stride) {
        check_tile<tile>("TILELOADD");
        const int rows = config_.rows[tile], colsb = config_.colsb[tile];
        std::memset(data_[tile], 0, sizeof data_[tile]);
        for (int r = 0; r < rows; ++r)
            std::memcpy(data_[tile][r], static_cast<const char *>(base) + r * stride, colsb);
    }
    template <int tile> void store(void *base, long stride) {
        check_tile<tile>("TILESTORED");
        const int rows = config_.rows[tile], colsb = config_.colsb[tile];
        for (int r = 0; r < rows; ++r)
            std::memcpy(static_cast<char *>(base) + r * stride, data_[tile][r], colsb);
    }
    template <int tile> void zero() {
        check_tile<tile>("TILEZERO");
        std::memset(data_[tile], 0, sizeof data_[tile]);
    }
    template <int c, int a, int b> PAGEDATTN_NO_COVERAGE void dpbf16ps() {
        static_assert(c != a && c != b && a != b, "TDPBF16PS needs three different tiles");
        check_tile<c>("TDPBF16PS");
        check_tile<a>("TDPBF16PS");
        check_tile<b>("TDPBF16PS");
        const int m_rows = config_.rows[c], n = config_.colsb[c] / 4, k_pairs = config_.colsb[a] / 4;
        if (config_.colsb[c] % 4 || config_.colsb[a] % 4)
            fault("TDPBF16PS", c, "C and A rows must hold whole dwords (%d, %d bytes)", config_.colsb[c],
                  config_.colsb[a]);
        if (config_.rows[a] != m_rows) fault("TDPBF16PS", a, "A has %d rows, C %d", config_.rows[a], m_rows);
        if (config_.rows[b] != k_pairs)
            fault("TDPBF16PS", b, "B has %d rows, A's %d bytes per row need %d", config_.rows[b],
                  config_.colsb[a], k_pairs);
        if (config_.colsb[b] != config_.colsb[c])
            fault("TDPBF16PS", b, "B has %d bytes per row, C %d", config_.colsb[b], config_.colsb[c]);
        const default_rounding rounding;
        for (int m = 0; m < m_rows; ++m) {
            float even[max_colsb / 4] = {}, odd[max_colsb / 4] = {};
            for (int k = 0; k < k_pairs; ++k) {
                const float a0 = bf16_at(data_[a][m], 2 * k), a1 = bf16_at(data_[a][m], 2 * k + 1);
                for (int j = 0; j < n; ++j) {
                    even[j] = flush(std::fma(a0, bf16_at(data_[b][k], 2 * j), even[j]));
                    odd[j] = flush(std::fma(a1, bf16_at(data_[b][k], 2 * j + 1), odd[j]));
                }
            }
            for (int j = 0; j < n; ++j) {
                float acc;
                std::memcpy(&acc, data_[c][m] + 4 * j, 4);
                acc = flush(flush(acc) + flush(even[j] + odd[j]));
                std::memcpy(data_[c][m] + 4 * j, &acc, 4);
            }
            std::memset(data_[c][m] + 4 * n, 0, max_colsb - 4 * n);
        }
        for (int m = m_rows; m < max_rows; ++m)
            std::memset(data_[c][m], 0, max_colsb);
    }
    void release() {
        configured_ = false;
        config_ = tile_config {};
    }

private:
    // MXCSR's default (round to nearest even, no FTZ/DAZ, exceptions masked) while the products
    // run: the flushes below are the instruction's own, explicit.
    struct default_rounding {
#if defined(__x86_64__) || defined(__i386__)
        unsigned saved = _mm_getcsr();
        default_rounding() {
            _mm_setcsr(0x1F80);
        }
        ~default_rounding() {
            _mm_setcsr(saved);
        }
#endif
    };
    PAGEDATTN_NO_COVERAGE static float flush(float x) { // DAZ and FTZ: a denormal is a zero of its sign
        return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x;
    }
    PAGEDATTN_NO_COVERAGE static float bf16_at(const uint8_t *row, int i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, 2);
        const uint32_t wide = static_cast<uint32_t>(bits) << 16;
        float x;
        std::memcpy(&x, &wide, 4);
        return flush(x);
    }
    template <int tile> void check_tile(const char *instruction) const {
        static_assert(tile >= 0 && tile < tile_count, "palette 1 has tiles 0-7");
        if (!configured_) fault(instruction, tile, "no tile configuration is loaded");
        if (config_.rows[tile] == 0) fault(instruction, tile, "the tile is not configured");
    }
    [[noreturn]] __attribute__((format(printf, 3, 4))) static void fault(const char *instruction, int tile,
                                                                         const char *format, ...) {
        char what[160];
        va_list args;
        va_start(args, format);
        std::vsnprintf(what, sizeof what, format, args);
        va_end(args);
        std::fprintf(stderr, "pagedattn AMX emulator: %s on tile %d: %s\n", instruction, tile, what);
        std::abort();
    }

    tile_config config_;
    bool configured_ = false;
    alignas(64) uint8_t data_[tile_count][max_rows][max_colsb] = {};
};

} // namespace amx_tiles
} // namespace detail
} // namespace pagedattn
