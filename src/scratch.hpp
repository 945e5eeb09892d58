// Scratch memory for kernels: one region per arena thread, plus one region shared by the tasks of
// one execute (e.g. the partial results of a split KV range). From buffers the primitive owns
// (scratchpad_mode::library) or carved from the caller's ARG_SCRATCHPAD (scratchpad_mode::user).
#pragma once

#include <cstddef>
#include <memory>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

/// Buffers a primitive owns, allocated on first use and reused: one per OS thread for the task
/// bodies (which never wait, so one thread runs one at a time), and a pool of shared regions, one
/// taken by each execute for its duration. The shared region is not the calling thread's: while
/// it waits inside one execute's loop, TBB may run another execute on the same thread.
class library_scratch {
public:
    struct buffer;
    /// A shared region taken from the pool; back to the pool when destroyed.
    class shared_region {
    public:
        shared_region() = default;
        shared_region(library_scratch *owner, buffer *taken) : owner_(owner), taken_(taken) {}
        shared_region(shared_region &&other) noexcept : owner_(other.owner_), taken_(other.taken_) {
            other.taken_ = nullptr;
        }
        shared_region &operator=(shared_region &&) = delete;
        ~shared_region();
        char *data() const;

    private:
        library_scratch *owner_ = nullptr;
        buffer *taken_ = nullptr;
    };

    explicit library_scratch(size_t bytes_per_thread);
    ~library_scratch();
    /// The calling thread's region for one task body.
    char *local();
    /// A region of `bytes` (none for 0) that no other execute uses while it lives.
    shared_region take_shared(size_t bytes);

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
        : library_(library), region_(library->take_shared(shared_bytes)), shared_(region_.data()) {}
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
    library_scratch::shared_region region_;
    char *base_ = nullptr;
    size_t stride_ = 0;
    char *shared_ = nullptr;
};

/// The arena's concurrency (what the scratchpad is sized for).
int current_max_threads();

} // namespace detail
} // namespace pagedattn
