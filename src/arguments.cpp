#include "arguments.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pagedattn {
namespace detail {

argument_checker::argument_checker(const char *primitive, const exec_args &args, const argument_ids &allowed)
    : primitive_(primitive), args_(args) {
    for (const auto &entry : args) {
        if (allowed.contains(entry.first)) continue;
        if (std::strcmp(arg_name(entry.first), "unknown") == 0)
            throw_error(status::invalid_arguments, concat(primitive, ": unknown argument id ", entry.first));
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument ", arg_name(entry.first), " (id ", entry.first,
                           ") is not expected by this primitive_desc"));
    }
}

void argument_checker::fail(int arg, const std::string &rule) const {
    throw_error(status::invalid_arguments, concat(primitive_, ": argument ", arg_name(arg), ": ", rule));
}

const tensor &argument_checker::required(int arg) const {
    auto it = args_.find(arg);
    if (it == args_.end())
        throw_error(status::invalid_arguments, concat(primitive_, ": missing argument ", arg_name(arg)));
    const tensor &t = it->second;
    expect(t.get_data_handle() != nullptr || t.get_desc().nelems() == 0, arg, "null data pointer");
    return t;
}

const tensor *argument_checker::optional(int arg) const {
    return args_.count(arg) ? &required(arg) : nullptr;
}

void argument_checker::expect_type(const tensor &t, int arg, data_type expected) const {
    PAGEDATTN_EXPECT(*this, t.get_desc().get_data_type() == expected, arg, "data type ",
                     data_type_name(t.get_desc().get_data_type()), ", expected ", data_type_name(expected));
}

void argument_checker::expect_shape(const tensor &t, int arg, std::initializer_list<dim> expected,
                                    const char *shape_text) const {
    const tensor_desc &d = t.get_desc();
    bool match = d.ndims() == static_cast<int>(expected.size());
    for (size_t i = 0; match && i < expected.size(); ++i)
        match = expected.begin()[i] == runtime_dim || expected.begin()[i] == d.get_dims()[i];
    PAGEDATTN_EXPECT(*this, match, arg, "dims ", dims_string(d.get_dims()), ", expected ", shape_text, " = ",
                     dims_string(dims(expected)));
    for (dim v : d.get_dims())
        expect(v >= 0 && v != runtime_dim, arg, "dims must be known and non-negative at execute");
    for (dim s : d.get_strides())
        expect(s >= 0, arg, "strides must be non-negative");
    expect(d.ndims() == 0 || d.get_dims().back() <= 1 || d.get_strides().back() == 1, arg,
           "the innermost dim must have unit stride");
}

void argument_checker::expect_desc(const tensor &t, int arg, const tensor_desc &expected) const {
    PAGEDATTN_EXPECT(*this, t.get_desc() == expected, arg, "descriptor ", t.get_desc().str(),
                     " differs from the primitive_desc's ", expected.str(), " (allocate it from query_md)");
}

void argument_checker::expect_scales(const tensor &t, int arg, int mask, const dims &cache_dims,
                                     bool values_are_inputs) const {
    dim expected[3] = { 1, 0, 0 };
    int rank = 1;
    if (mask == scales_per_kv_head) {
        expected[0] = cache_dims[1];
    } else if (mask == scales_per_token) {
        expected[0] = cache_dims[0];
        expected[1] = cache_dims[1];
        expected[2] = cache_dims[2];
        rank = 3;
    }
    expect_type(t, arg, data_type::f32);
    const tensor_desc &d = t.get_desc();
    bool dense = d.ndims() == rank;
    dim stride = 1;
    for (int i = rank - 1; dense && i >= 0; --i) {
        dense = d.get_dims()[i] == expected[i] && (expected[i] == 1 || d.get_strides()[i] == stride);
        stride *= expected[i];
    }
    PAGEDATTN_EXPECT(*this, dense, arg, "dims ", dims_string(d.get_dims()), ", expected dense ",
                     dims_string(dims(expected, expected + rank)), " for scales mask ", mask);
    if (!values_are_inputs) return;
    const float *values = static_cast<const float *>(t.get_data_handle());
    for (dim i = 0; i < d.nelems(); ++i)
        PAGEDATTN_EXPECT(*this, std::isfinite(values[i]) && values[i] > 0.f, arg, "scale ", values[i],
                         " at index ", i, " must be finite and > 0");
}

namespace {
data_type from_dnnl(dnnl::memory::data_type dt) {
    switch (dt) {
        case dnnl::memory::data_type::f32: return data_type::f32;
        case dnnl::memory::data_type::bf16: return data_type::bf16;
        case dnnl::memory::data_type::f16: return data_type::f16;
        case dnnl::memory::data_type::s32: return data_type::s32;
        case dnnl::memory::data_type::s8: return data_type::s8;
        case dnnl::memory::data_type::u8: return data_type::u8;
        default: return data_type::undef;
    }
}
} // namespace

tensor tensor_from_memory(const char *primitive, int arg, const dnnl::memory &memory) {
    if (!memory)
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument ", arg_name(arg), ": empty dnnl::memory"));
    const dnnl::memory::desc md = memory.get_desc();
    const dnnl_memory_desc_t &raw = md.data;
    if (raw.format_kind != dnnl_blocked || raw.format_desc.blocking.inner_nblks != 0)
        throw_error(status::invalid_arguments, concat(primitive, ": argument ", arg_name(arg),
                                                      ": only plain strided dnnl::memory is accepted"));
    dims d(raw.dims, raw.dims + raw.ndims);
    dims strides(raw.format_desc.blocking.strides, raw.format_desc.blocking.strides + raw.ndims);
    const data_type dt = from_dnnl(md.data_type());
    char *data = static_cast<char *>(memory.get_data_handle());
    if (data) data += raw.offset0 * static_cast<dim>(data_type_size(dt));
    return tensor(tensor_desc(d, dt, strides), data);
}

tensor cache_tensor_from_memory(const char *primitive, int arg, const dnnl::memory &memory,
                                const tensor_desc &desc) {
    if (!memory)
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument ", arg_name(arg), ": empty dnnl::memory"));
    const size_t bytes = memory.get_desc().get_size();
    if (bytes < desc.get_size())
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument ", arg_name(arg), ": dnnl::memory of ", bytes,
                           " bytes, the cache needs ", desc.get_size()));
    return tensor(desc, memory.get_data_handle());
}

} // namespace detail
} // namespace pagedattn
