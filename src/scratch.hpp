// Per-thread scratch memory for kernels: from buffers the primitive owns (scratchpad_mode::library)
// or carved from the caller's ARG_SCRATCHPAD (scratchpad_mode::user), one slot per arena thread.
#pragma once

#include <cstddef>
#include <memory>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

/// Buffers a primitive owns: one per OS thread that ran its tasks, allocated on first use, reused.
class library_scratch {
public:
    explicit library_scratch(size_t bytes_per_thread);
    ~library_scratch();
    char *local();

private:
    struct buffers;
    std::unique_ptr<buffers> buffers_;
};

/// What a kernel asks for its scratch, valid for one execute.
class thread_scratch {
public:
    /// Library mode.
    explicit thread_scratch(library_scratch *library) : library_(library) {}
    /// User mode: `base` holds `required` bytes: `slots` slots of `bytes_per_thread` (rounded up to
    /// 64) plus alignment slack. Throws when `size` is smaller or the calling arena has more
    /// threads than slots.
    thread_scratch(const char *primitive, void *base, size_t size, size_t required, size_t bytes_per_thread,
                   int slots);
    /// 64-byte aligned scratch of the calling thread.
    char *get() const;

private:
    library_scratch *library_ = nullptr;
    char *base_ = nullptr;
    size_t stride_ = 0;
};

/// The arena's concurrency (what the scratchpad is sized for).
int current_max_threads();

} // namespace detail
} // namespace pagedattn
