// Scratch memory for kernels: one region per arena thread, plus one region shared by the tasks of
// one execute (e.g. the partial results of a split KV range). From buffers the primitive owns
// (scratchpad_mode::library) or carved from the caller's ARG_SCRATCHPAD (scratchpad_mode::user).
#pragma once

#include <cstddef>
#include <memory>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

/// Buffers a primitive owns: per OS thread, allocated on first use and reused. The shared region
/// of an execute belongs to the thread that called execute, so concurrent executes never share.
class library_scratch {
public:
    explicit library_scratch(size_t bytes_per_thread);
    ~library_scratch();
    char *local();
    /// The calling thread's shared region, grown to `bytes` if needed.
    char *shared(size_t bytes);

private:
    struct buffers;
    std::unique_ptr<buffers> buffers_;
};

/// The bytes a user scratchpad needs: `slots` per-thread regions plus a shared one.
size_t user_scratchpad_bytes(size_t bytes_per_thread, int slots, size_t shared_bytes);

/// What a kernel asks for its scratch, valid for one execute.
class thread_scratch {
public:
    /// Library mode.
    thread_scratch(library_scratch *library, size_t shared_bytes)
        : library_(library), shared_(library->shared(shared_bytes)) {}
    /// User mode: `base` holds `size` bytes, at least user_scratchpad_bytes(bytes_per_thread,
    /// slots, shared_capacity). Throws when it is smaller or when the calling arena has more
    /// threads than slots.
    thread_scratch(const char *primitive, void *base, size_t size, size_t bytes_per_thread, int slots,
                   size_t shared_capacity);
    /// 64-byte aligned scratch of the calling thread.
    char *get() const;
    /// 64-byte aligned region shared by the tasks of this execute.
    char *shared() const { return shared_; }

private:
    library_scratch *library_ = nullptr;
    char *base_ = nullptr;
    size_t stride_ = 0;
    char *shared_ = nullptr;
};

/// The arena's concurrency (what the scratchpad is sized for).
int current_max_threads();

} // namespace detail
} // namespace pagedattn
