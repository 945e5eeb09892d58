// pagedattn: types shared by every primitive — errors, data types, tensor descriptors, argument ids,
// attributes, ISA and verbose controls, and the primitive_desc base.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedattn/version.hpp"

namespace pagedattn {

using dim = int64_t;
using dims = std::vector<dim>;

/// A dimension that is only known at execute (the step's token count, sequence count, block-table
/// width); the same value as oneDNN's DNNL_RUNTIME_DIM_VAL.
constexpr dim runtime_dim = DNNL_RUNTIME_DIM_VAL;

/// Values equal oneDNN's dnnl_status_t.
enum class status : int {
    success = 0,
    out_of_memory = 1,
    invalid_arguments = 2,
    unimplemented = 3,
    iterator_ends = 4,
    runtime_error = 5,
    not_required = 6,
};

/// Every failure of the library. Derives from dnnl::error, so `catch (dnnl::error &)` sees it too;
/// unlike dnnl::error it owns its message, which names the argument and the rule it broke.
class error : public dnnl::error {
public:
    error(pagedattn::status s, const std::string &message);
    pagedattn::status get_status() const noexcept { return status_; }
    const char *what() const noexcept override { return text_->c_str(); }

private:
    pagedattn::status status_;
    std::shared_ptr<const std::string> text_; // shared so that copies keep the base's pointer valid
};

/// Values equal oneDNN 3.x dnnl_data_type_t; s64 has no oneDNN value and sits outside its range.
enum class data_type : int {
    undef = 0,
    f16 = 1,
    bf16 = 2,
    f32 = 3,
    s32 = 4,
    s8 = 5,
    u8 = 6,
    f8_e5m2 = 9,  ///< OCP e5m2: bias 15, max 57344, IEEE-style inf and NaN
    f8_e4m3 = 10, ///< OCP e4m3fn: bias 7, max 448, no inf, NaN = S.1111.111
    s64 = 0x100,
};

/// Bytes per element (0 for undef).
size_t data_type_size(data_type dt);
/// "f32", "bf16", "f8_e4m3", ...
const char *data_type_name(data_type dt);

/// Layout of a KV cache, whose logical dims are [num_blocks, kv_heads, block_size, head_size].
enum class layout : int {
    /// Strided: caller-given element strides for blocks, heads and tokens, unit stride on the head
    /// dim. Covers head-major (HND), token-major (NHD) and K/V interleaved in one allocation.
    plain = 0,
    /// Blocked for pair products (vdpbf16ps, AMX tiles), the same on every machine. Each (block,
    /// head) region holds block_size * head_size contiguous elements; blocks and heads keep
    /// caller-set strides (multiples of 64 bytes). Inside a region, with t the token and d the dim:
    ///   K element (t, d) at (t / 16) * 16 * head_size + (d / 2) * 32 + (t % 16) * 2 + d % 2
    ///     (rows of 16 tokens x a pair of dims),
    ///   V element (t, d) at (d / 16) * 16 * block_size + (t / 2) * 32 + (d % 16) * 2 + t % 2
    ///     (rows of 16 dims x a pair of tokens).
    /// FP8 caches use the same element order with 1-byte elements. Needs block_size % 16 == 0 and
    /// head_size % 16 == 0.
    packed = 1,
    /// Let the primitive_desc choose, from the cache's dims and data type alone (never from the
    /// machine), so that every primitive agrees: packed where it applies, dense plain otherwise.
    any = 2,
};
const char *layout_name(layout l);

/// Logical dims, element strides and data type of a tensor, plus a layout for KV caches. A
/// default-constructed desc is the zero desc ("absent").
class tensor_desc {
public:
    tensor_desc() = default;
    /// Dense row-major strides. A runtime_dim leaves dims and strides to execute.
    tensor_desc(const dims &sizes, data_type dt);
    tensor_desc(const dims &sizes, data_type dt, const dims &strides);
    /// A KV cache of layout `l` with dense strides (plain: HND); `any` is resolved by the
    /// primitive_desc (see its query_md).
    tensor_desc(const dims &sizes, data_type dt, layout l);
    /// A KV cache of layout `l` with caller-set strides (packed: only the block and head strides
    /// are free; the token and dim strides are head_size and 1).
    tensor_desc(const dims &sizes, data_type dt, const dims &strides, layout l);

    int ndims() const { return static_cast<int>(dims_.size()); }
    const dims &get_dims() const { return dims_; }
    const dims &get_strides() const { return strides_; }
    data_type get_data_type() const { return data_type_; }
    layout get_layout() const { return layout_; }
    /// Bytes from the first element to one past the last one (0 if any dim is 0 or runtime).
    size_t get_size() const;
    dim nelems() const;
    bool is_zero() const { return data_type_ == data_type::undef && dims_.empty(); }
    bool has_runtime_dims() const;
    bool operator==(const tensor_desc &other) const;
    bool operator!=(const tensor_desc &other) const { return !(*this == other); }
    /// "f8_e4m3:plain:64x8x16x128" (strides appended when not dense).
    std::string str() const;

private:
    dims dims_, strides_;
    data_type data_type_ = data_type::undef;
    layout layout_ = layout::plain;
};

/// A non-owning view of caller memory: a descriptor and a pointer.
class tensor {
public:
    tensor() = default;
    tensor(const tensor_desc &desc, void *data) : desc_(desc), data_(data) {}
    tensor(const tensor_desc &desc, const void *data) : desc_(desc), data_(const_cast<void *>(data)) {}
    tensor(const tensor_desc &desc, std::nullptr_t) : desc_(desc) {}
    const tensor_desc &get_desc() const { return desc_; }
    void *get_data_handle() const { return data_; }

private:
    tensor_desc desc_;
    void *data_ = nullptr;
};

/// Argument ids. Roles that oneDNN has reuse its DNNL_ARG_* values; the paged ones sit in
/// [320, 352), which neither oneDNN 2.6 nor 3.x uses.
enum : int {
    ARG_QUERY = DNNL_ARG_SRC_0,
    ARG_KEY = DNNL_ARG_SRC_1,
    ARG_VALUE = DNNL_ARG_SRC_2,
    ARG_DST = DNNL_ARG_DST,
    ARG_SCRATCHPAD = DNNL_ARG_SCRATCHPAD,
    ARG_K_CACHE = 320,
    ARG_V_CACHE = 321,
    ARG_BLOCK_TABLE = 322,
    ARG_SEQ_LENS = 323,
    ARG_QUERY_START_LOC = 324,
    ARG_SLOT_MAPPING = 325,
    ARG_ALIBI_SLOPES = 326,
    ARG_SINKS = 327,
    ARG_K_SCALES = 328,
    ARG_V_SCALES = 329,
    ARG_PLAN = 330,
};
/// "query", "k_cache", ... ("unknown" for ids the library does not define).
const char *arg_name(int arg);

/// Instruction-set levels, ordered: each includes the ones before it.
enum class cpu_isa : int {
    generic = 0,     ///< portable C++ only (the reference)
    avx2 = 1,        ///< AVX2 + FMA + F16C
    avx512 = 2,      ///< AVX-512 F/BW/VL
    avx512_bf16 = 3, ///< plus AVX512-BF16 and AVX512-VBMI (not Cooper Lake: BF16 without VBMI)
    amx = 4,         ///< plus AMX-TILE/AMX-BF16 with the OS permission granted
    all = 5,         ///< no cap
};
const char *cpu_isa_name(cpu_isa isa);
/// The best level this machine and its OS support (CPUID + XCR0; AMX also needs Linux's
/// arch_prctl(ARCH_REQ_XCOMP_PERM) permission, requested once).
cpu_isa get_host_cpu_isa();
/// min(host, PAGEDATTN_MAX_CPU_ISA): the level implementations may use unless an attribute lowers
/// it further. The environment variable is read once (avx2|avx512|avx512_bf16|amx|all|generic,
/// case-insensitive); an unknown value is ignored with a message on stderr.
cpu_isa get_max_cpu_isa();

/// PAGEDATTN_VERBOSE: 0 quiet, 1 a line per execute, 2 also per creation, 3 also why each
/// implementation declined. set_verbose overrides the environment for the whole process.
int get_verbose();
void set_verbose(int level);

enum class scratchpad_mode { library, user };
/// oneDNN's fpmath_mode: under strict, f32 and f16 inputs are multiplied in f32; bf16 lets an
/// implementation multiply them in bf16. bf16 and FP8 values are exact in bf16 under either.
enum class fpmath_mode { strict, bf16 };

/// Scales masks, as oneDNN 3.x set_scales_mask on the cache argument (bit i = varies along
/// logical dim i of [num_blocks, kv_heads, block_size, head_size]).
enum : int {
    scales_per_tensor = 0,                             ///< f32 [1]
    scales_per_kv_head = 1 << 1,                       ///< f32 [kv_heads]
    scales_per_token = (1 << 0) | (1 << 1) | (1 << 2), ///< f32 [num_blocks, kv_heads, block_size]
};

class primitive_attr {
public:
    primitive_attr();
    /// Scales for an FP8 cache (arg ARG_K_CACHE or ARG_V_CACHE). Without a mask an FP8 cache has
    /// scale 1. The values are passed at execute as ARG_K_SCALES / ARG_V_SCALES.
    void set_scales_mask(int arg, int mask);
    /// -1 when unset.
    int get_scales_mask(int arg) const;
    void set_scratchpad_mode(scratchpad_mode mode) { scratchpad_mode_ = mode; }
    scratchpad_mode get_scratchpad_mode() const { return scratchpad_mode_; }
    void set_fpmath_mode(fpmath_mode mode) { fpmath_mode_ = mode; }
    fpmath_mode get_fpmath_mode() const { return fpmath_mode_; }
    /// Caps the ISA for primitives created with this attribute; it can only lower the process cap.
    void set_max_cpu_isa(cpu_isa isa) { max_cpu_isa_ = isa; }
    cpu_isa get_max_cpu_isa() const { return max_cpu_isa_; }
    bool operator==(const primitive_attr &other) const;

private:
    int k_scales_mask_ = -1, v_scales_mask_ = -1;
    scratchpad_mode scratchpad_mode_ = scratchpad_mode::library;
    fpmath_mode fpmath_mode_ = fpmath_mode::strict;
    cpu_isa max_cpu_isa_ = cpu_isa::all;
};

namespace detail {
struct primitive_desc_state;
} // namespace detail

/// What every primitive_desc answers. Copies share state (oneDNN handle semantics).
class primitive_desc_base {
public:
    /// "ref:any", "x64:avx2", "x64:avx512", "x64:avx512_bf16", "x64:amx".
    const char *impl_info_str() const;
    /// Moves to the next implementation of the list that accepts the problem; false (and the pd
    /// unchanged) when there is none.
    bool next_impl();
    /// The descriptor the implementation uses for an argument; for caches, the resolved layout
    /// and strides to allocate with. Runtime dims stay runtime_dim. Zero desc for unknown args.
    tensor_desc query_md(int arg) const;
    /// Bytes the caller passes as ARG_SCRATCHPAD in scratchpad_mode::user (u8 [size]); a zero
    /// desc in library mode.
    tensor_desc scratchpad_desc() const;
    dnnl::engine get_engine() const;
    const primitive_attr &get_primitive_attr() const;
    /// False only for a pd made with allow_empty that found no implementation.
    explicit operator bool() const { return state_ != nullptr; }

    // Internal.
    const std::shared_ptr<detail::primitive_desc_state> &state() const { return state_; }

protected:
    std::shared_ptr<detail::primitive_desc_state> state_;
};

/// The argument map of execute.
using exec_args = std::unordered_map<int, tensor>;

} // namespace pagedattn
