// Checking execute arguments: every rule broken names the primitive, the argument and the rule.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>

#include "error.hpp"

namespace pagedattn {
namespace detail {

/// A small set of argument ids (no allocation: execute stays allocation-free).
class argument_ids {
public:
    argument_ids(std::initializer_list<int> ids) {
        for (int id : ids)
            add(id);
    }
    void add(int id) { ids_[count_++] = id; }
    bool contains(int id) const { return std::find(ids_, ids_ + count_, id) != ids_ + count_; }

private:
    int ids_[24] = {};
    int count_ = 0;
};

/// check.expect(condition, arg, concat(message...)), with the message built only on failure.
#define PAGEDATTN_EXPECT(checker, condition, arg, ...)                                                       \
    do {                                                                                                     \
        if (!(condition)) (checker).fail(arg, ::pagedattn::detail::concat(__VA_ARGS__));                     \
    } while (0)

class argument_checker {
public:
    /// Rejects ids outside `allowed` (unknown ids and ones this primitive does not expect here).
    argument_checker(const char *primitive, const exec_args &args, const argument_ids &allowed);

    /// The tensor of a required argument; its pointer must be non-null unless it has no elements.
    const tensor &required(int arg) const;
    /// Null when absent.
    const tensor *optional(int arg) const;

    [[noreturn]] void fail(int arg, const std::string &rule) const;
    /// A fixed rule; PAGEDATTN_EXPECT builds a composed message only when the check fails, so
    /// that a valid execute allocates nothing.
    void expect(bool condition, int arg, const char *rule) const {
        if (!condition) fail(arg, rule);
    }
    /// Rank, data type, dims (runtime_dim entries match anything) and a unit innermost stride.
    void expect_shape(const tensor &t, int arg, std::initializer_list<dim> expected,
                      const char *shape_text) const;
    void expect_type(const tensor &t, int arg, data_type expected) const;
    /// The tensor must equal `expected` exactly (caches: dims, strides, data type and layout).
    void expect_desc(const tensor &t, int arg, const tensor_desc &expected) const;
    /// Scales for an FP8 cache: f32 dense with the dims of `mask`; per-tensor and per-kv-head
    /// values (inputs) must be finite and > 0.
    void expect_scales(const tensor &t, int arg, int mask, const dims &cache_dims,
                       bool values_are_inputs) const;

    const char *primitive() const { return primitive_; }

private:
    const char *primitive_;
    const exec_args &args_;
};

/// oneDNN interop: turns dnnl::memory arguments into tensors. A cache argument (k_cache/v_cache)
/// takes its descriptor from `cache_desc(arg)` and needs at least that many bytes.
template <typename CacheDesc>
exec_args tensors_from_memories(const char *primitive, const std::unordered_map<int, dnnl::memory> &args,
                                CacheDesc cache_desc);

tensor tensor_from_memory(const char *primitive, int arg, const dnnl::memory &memory);
tensor cache_tensor_from_memory(const char *primitive, int arg, const dnnl::memory &memory,
                                const tensor_desc &desc);

template <typename CacheDesc>
exec_args tensors_from_memories(const char *primitive, const std::unordered_map<int, dnnl::memory> &args,
                                CacheDesc cache_desc) {
    exec_args out;
    for (const auto &entry : args) {
        const bool cache = entry.first == ARG_K_CACHE || entry.first == ARG_V_CACHE;
        out[entry.first] = cache ? cache_tensor_from_memory(primitive, entry.first, entry.second,
                                                            cache_desc(entry.first))
                                 : tensor_from_memory(primitive, entry.first, entry.second);
    }
    return out;
}

} // namespace detail
} // namespace pagedattn
