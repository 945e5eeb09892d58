#include "scratch.hpp"

#include <cstdint>
#include <cstdlib>
#include <new>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>

#include "error.hpp"

namespace pagedattn {
namespace detail {

namespace {
struct free_deleter {
    void operator()(char *p) const { std::free(p); }
};
using aligned_buffer = std::unique_ptr<char, free_deleter>;
} // namespace

struct library_scratch::buffers {
    size_t bytes;
    tbb::enumerable_thread_specific<aligned_buffer> per_thread;
};

library_scratch::library_scratch(size_t bytes_per_thread)
    : buffers_(new buffers { (bytes_per_thread + 63) / 64 * 64, {} }) {}

library_scratch::~library_scratch() = default;

char *library_scratch::local() {
    aligned_buffer &buffer = buffers_->per_thread.local();
    if (!buffer && buffers_->bytes) {
        buffer.reset(static_cast<char *>(std::aligned_alloc(64, buffers_->bytes)));
        if (!buffer) throw std::bad_alloc();
    }
    return buffer.get();
}

thread_scratch::thread_scratch(const char *primitive, void *base, size_t size, size_t required,
                               size_t bytes_per_thread, int slots)
    : stride_((bytes_per_thread + 63) / 64 * 64) {
    if (size < required)
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument scratchpad: ", size, " bytes are fewer than the ", required,
                           " of scratchpad_desc()"));
    const int threads = current_max_threads();
    if (threads > slots)
        throw_error(status::invalid_arguments,
                    concat(primitive, ": argument scratchpad: the primitive_desc sized it for ", slots,
                           " threads, but this arena runs ", threads,
                           "; create the primitive_desc in this arena"));
    const uintptr_t address = reinterpret_cast<uintptr_t>(base);
    base_ = reinterpret_cast<char *>((address + 63) / 64 * 64);
}

char *thread_scratch::get() const {
    if (library_) return library_->local();
    const int slot = tbb::this_task_arena::current_thread_index();
    return base_ + stride_ * static_cast<size_t>(slot < 0 ? 0 : slot);
}

int current_max_threads() {
    return tbb::this_task_arena::max_concurrency();
}

} // namespace detail
} // namespace pagedattn
