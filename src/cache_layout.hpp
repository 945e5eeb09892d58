// Where element (token t, dim d) of one (block, head) region of a KV cache lives, for each layout.
// The packed layout is defined in include/pagedattn/common.hpp (layout::packed); this is its one
// implementation, used by every kernel and by reshape_and_cache.
#pragma once

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

constexpr dim packed_group = 16; // tokens per K row, dims per V row

inline dim packed_k_offset(dim t, dim d, dim head_size) {
    return (t / 16) * 16 * head_size + (d / 2) * 32 + (t % 16) * 2 + d % 2;
}
inline dim packed_v_offset(dim t, dim d, dim block_size) {
    return (d / 16) * 16 * block_size + (t / 2) * 32 + (d % 16) * 2 + t % 2;
}

/// A cache seen through its resolved descriptor: element offsets of (block, head, t, d).
class cache_view {
public:
    /// `is_value`: the V order of the packed layout (else the K order).
    cache_view(const tensor_desc &cache, bool is_value)
        : packed_(cache.get_layout() == layout::packed),
          value_(is_value), strides_ { cache.get_strides()[0], cache.get_strides()[1],
                                       cache.get_strides()[2] },
          block_size_(cache.get_dims()[2]), head_size_(cache.get_dims()[3]) {}
    bool packed() const { return packed_; }
    /// Offset, in elements, of the (block, head) region (packed) or of row t = 0 (plain).
    dim region(dim block, dim head) const { return block * strides_[0] + head * strides_[1]; }
    dim offset(dim block, dim head, dim t, dim d) const {
        if (!packed_) return region(block, head) + t * strides_[2] + d;
        return region(block, head) +
               (value_ ? packed_v_offset(t, d, block_size_) : packed_k_offset(t, d, head_size_));
    }
    dim token_stride() const { return strides_[2]; } // plain only

private:
    bool packed_, value_;
    dim strides_[3]; // block, head, token (plain); a copy without allocation
    dim block_size_, head_size_;
};

} // namespace detail
} // namespace pagedattn
