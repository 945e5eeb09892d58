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
size_t round_up(size_t bytes) {
    return (bytes + 63) / 64 * 64;
}

struct aligned_buffer {
    char *data = nullptr;
    size_t size = 0;
    aligned_buffer() = default;
    aligned_buffer(const aligned_buffer &) = delete;
    aligned_buffer &operator=(const aligned_buffer &) = delete;
    ~aligned_buffer() { std::free(data); }
    char *reserve(size_t bytes) {
        if (bytes <= size) return data;
        std::free(data);
        data = static_cast<char *>(std::aligned_alloc(64, round_up(bytes)));
        if (!data) throw std::bad_alloc();
        size = round_up(bytes);
        return data;
    }
};
} // namespace

struct library_scratch::buffers {
    size_t bytes;
    tbb::enumerable_thread_specific<aligned_buffer> per_thread, shared;
};

library_scratch::library_scratch(size_t bytes_per_thread) : buffers_(new buffers) {
    buffers_->bytes = round_up(bytes_per_thread);
}

library_scratch::~library_scratch() = default;

char *library_scratch::local() {
    return buffers_->bytes ? buffers_->per_thread.local().reserve(buffers_->bytes) : nullptr;
}

char *library_scratch::shared(size_t bytes) {
    return bytes ? buffers_->shared.local().reserve(bytes) : nullptr;
}

size_t user_scratchpad_bytes(size_t bytes_per_thread, int slots, size_t shared_bytes) {
    const size_t total = round_up(bytes_per_thread) * static_cast<size_t>(slots) + round_up(shared_bytes);
    return total ? total + 64 : 0; // + slack to align the caller's pointer
}

thread_scratch::thread_scratch(const char *primitive, void *base, size_t size, size_t bytes_per_thread,
                               int slots, size_t shared_capacity)
    : stride_(round_up(bytes_per_thread)) {
    const size_t required = user_scratchpad_bytes(bytes_per_thread, slots, shared_capacity);
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
    shared_ = base_ + stride_ * static_cast<size_t>(slots);
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
