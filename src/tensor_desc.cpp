#include <algorithm>
#include <limits>
#include <string>

#include "error.hpp"

namespace pagedattn {

size_t data_type_size(data_type dt) {
    switch (dt) {
        case data_type::f32:
        case data_type::s32: return 4;
        case data_type::f16:
        case data_type::bf16: return 2;
        case data_type::s8:
        case data_type::u8:
        case data_type::f8_e4m3:
        case data_type::f8_e5m2: return 1;
        case data_type::s64: return 8;
        default: return 0;
    }
}

const char *data_type_name(data_type dt) {
    switch (dt) {
        case data_type::f16: return "f16";
        case data_type::bf16: return "bf16";
        case data_type::f32: return "f32";
        case data_type::s32: return "s32";
        case data_type::s8: return "s8";
        case data_type::u8: return "u8";
        case data_type::f8_e5m2: return "f8_e5m2";
        case data_type::f8_e4m3: return "f8_e4m3";
        case data_type::s64: return "s64";
        default: return "undef";
    }
}

const char *layout_name(layout l) {
    switch (l) {
        case layout::plain: return "plain";
        case layout::packed: return "packed";
        case layout::any: return "any";
    }
    return "unknown";
}

const char *arg_name(int arg) {
    switch (arg) {
        case ARG_QUERY: return "query";
        case ARG_KEY: return "key";
        case ARG_VALUE: return "value";
        case ARG_DST: return "dst";
        case ARG_SCRATCHPAD: return "scratchpad";
        case ARG_K_CACHE: return "k_cache";
        case ARG_V_CACHE: return "v_cache";
        case ARG_BLOCK_TABLE: return "block_table";
        case ARG_SEQ_LENS: return "seq_lens";
        case ARG_QUERY_START_LOC: return "query_start_loc";
        case ARG_SLOT_MAPPING: return "slot_mapping";
        case ARG_ALIBI_SLOPES: return "alibi_slopes";
        case ARG_SINKS: return "sinks";
        case ARG_K_SCALES: return "k_scales";
        case ARG_V_SCALES: return "v_scales";
        case ARG_PLAN: return "plan";
        default: return "unknown";
    }
}

namespace {
[[noreturn]] void throw_overflow(const dims &d) {
    detail::throw_error(
            status::invalid_arguments,
            detail::concat("tensor_desc: dims ", detail::dims_string(d),
                           ": the element count, an offset or the size in bytes overflows 64 bits"));
}

// Dense strides; a product that overflows 64 bits makes the desc invalid (it could not be addressed).
dims dense_strides(const dims &d) {
    dims strides(d.size(), 0);
    dim stride = 1;
    for (size_t i = d.size(); i-- > 0;) {
        strides[i] = stride;
        if (d[i] == runtime_dim || stride == runtime_dim)
            stride = runtime_dim;
        else if (__builtin_mul_overflow(stride, std::max<dim>(d[i], 1), &stride))
            throw_overflow(d);
    }
    return strides;
}

// Every count and offset get_size and nelems compute, and the byte size, fit 64 bits.
void check_extent(const dims &d, const dims &strides, data_type dt) {
    dim count = 1, last = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        if (d[i] == runtime_dim || strides[i] == runtime_dim || d[i] <= 0) continue;
        if (strides[i] == std::numeric_limits<dim>::min()) throw_overflow(d);
        dim reach;
        if (__builtin_mul_overflow(count, d[i], &count) ||
            __builtin_mul_overflow(d[i] - 1, strides[i] < 0 ? -strides[i] : strides[i], &reach) ||
            __builtin_add_overflow(last, reach, &last))
            throw_overflow(d);
    }
    dim bytes;
    if (__builtin_mul_overflow(last + 1, static_cast<dim>(std::max<size_t>(data_type_size(dt), 1)), &bytes))
        throw_overflow(d);
}
} // namespace

tensor_desc::tensor_desc(const dims &d, data_type dt) : dims_(d), strides_(dense_strides(d)), data_type_(dt) {
    check_extent(dims_, strides_, data_type_);
}

tensor_desc::tensor_desc(const dims &d, data_type dt, const dims &strides)
    : dims_(d), strides_(strides), data_type_(dt) {
    if (strides.size() != d.size())
        detail::throw_error(status::invalid_arguments, detail::concat("tensor_desc: ", d.size(), " dims but ",
                                                                      strides.size(), " strides"));
    check_extent(dims_, strides_, data_type_);
}

tensor_desc::tensor_desc(const dims &d, data_type dt, layout l) : tensor_desc(d, dt) {
    layout_ = l;
}

tensor_desc::tensor_desc(const dims &d, data_type dt, const dims &strides, layout l)
    : tensor_desc(d, dt, strides) {
    layout_ = l;
}

bool tensor_desc::has_runtime_dims() const {
    return std::find(dims_.begin(), dims_.end(), runtime_dim) != dims_.end();
}

dim tensor_desc::nelems() const {
    if (dims_.empty() || has_runtime_dims()) return 0;
    dim n = 1;
    for (dim d : dims_)
        n *= d;
    return n;
}

size_t tensor_desc::get_size() const {
    if (nelems() <= 0) return 0;
    dim last = 0; // offset of the farthest element, in elements
    for (size_t i = 0; i < dims_.size(); ++i) {
        if (strides_[i] == runtime_dim) return 0;
        last += (dims_[i] - 1) * std::abs(strides_[i]);
    }
    return static_cast<size_t>(last + 1) * data_type_size(data_type_);
}

bool tensor_desc::operator==(const tensor_desc &other) const {
    return dims_ == other.dims_ && strides_ == other.strides_ && data_type_ == other.data_type_ &&
           layout_ == other.layout_;
}

std::string tensor_desc::str() const {
    std::string out = std::string(data_type_name(data_type_)) + ":" + layout_name(layout_) + ":";
    for (size_t i = 0; i < dims_.size(); ++i) {
        if (i) out += "x";
        out += dims_[i] == runtime_dim ? std::string("*") : std::to_string(dims_[i]);
    }
    if (strides_ != dense_strides(dims_)) {
        out += ":s";
        for (size_t i = 0; i < strides_.size(); ++i) {
            if (i) out += "x";
            out += strides_[i] == runtime_dim ? std::string("*") : std::to_string(strides_[i]);
        }
    }
    return out;
}

} // namespace pagedattn
