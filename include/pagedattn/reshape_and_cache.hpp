// reshape_and_cache: writes a step's new key/value tokens into the paged KV cache, quantizing them
// when the cache is FP8.
#pragma once

#include "pagedattn/common.hpp"

namespace pagedattn {

/// Arguments of execute:
///   ARG_KEY, ARG_VALUE      [T, Hkv, D] f32/bf16/f16, unit stride on D
///   ARG_K_CACHE, ARG_V_CACHE  as query_md() gives them
///   ARG_SLOT_MAPPING        s64 or s32 [T]: slot = block * block_size + offset; negative = skip
///   ARG_K_SCALES, ARG_V_SCALES  f32, when the attribute sets a scales mask for that cache; read for
///                           per-tensor and per-kv-head, written for per-token scales
/// Every slot is validated before any byte is written. Two tokens mapped to the same slot: the
/// later token (in token order) is the one stored.
class reshape_and_cache {
public:
    class desc {
    public:
        /// key, value: [T, Hkv, D] (T a runtime_dim or fixed); caches [num_blocks, Hkv, block_size,
        /// D] with a layout.
        desc(const tensor_desc &key, const tensor_desc &value, const tensor_desc &k_cache,
             const tensor_desc &v_cache);
        const tensor_desc &key() const { return key_; }
        const tensor_desc &value() const { return value_; }
        const tensor_desc &k_cache() const { return k_cache_; }
        const tensor_desc &v_cache() const { return v_cache_; }

    private:
        tensor_desc key_, value_, k_cache_, v_cache_;
    };

    class primitive_desc : public primitive_desc_base {
    public:
        primitive_desc() = default;
        primitive_desc(const dnnl::engine &engine, const desc &d,
                       const primitive_attr &attr = primitive_attr(), bool allow_empty = false);
        const desc &get_desc() const;
    };

    reshape_and_cache() = default;
    explicit reshape_and_cache(const primitive_desc &pd);
    const primitive_desc &get_primitive_desc() const { return pd_; }

    void execute(const dnnl::stream &stream, const exec_args &args) const;
    void execute(const dnnl::stream &stream, const std::unordered_map<int, dnnl::memory> &args) const;

private:
    primitive_desc pd_;
};

} // namespace pagedattn
