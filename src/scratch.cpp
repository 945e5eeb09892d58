#include "scratch.hpp"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>

#include "error.hpp"

namespace pagedattn {
namespace detail {

namespace {
size_t round_up(size_t bytes) {
    return (bytes + 63) / 64 * 64;
}
} // namespace

struct library_scratch::buffer {
    char *data = nullptr;
    size_t size = 0;
    buffer() = default;
    buffer(const buffer &) = delete;
    buffer &operator=(const buffer &) = delete;
    ~buffer() { std::free(data); }
    char *reserve(size_t bytes) {
        if (bytes <= size) return data;
        std::free(data);
        data = static_cast<char *>(std::aligned_alloc(64, round_up(bytes)));
        if (!data) throw std::bad_alloc();
        size = round_up(bytes);
        return data;
    }
};

struct library_scratch::buffers {
    size_t bytes;
    tbb::enumerable_thread_specific<buffer> per_thread;
    std::mutex mutex; // guards idle_shared
    std::vector<std::unique_ptr<buffer>> idle_shared;
};

library_scratch::library_scratch(size_t bytes_per_thread) : buffers_(new buffers) {
    buffers_->bytes = round_up(bytes_per_thread);
}

library_scratch::~library_scratch() = default;

char *library_scratch::local() {
    return buffers_->bytes ? buffers_->per_thread.local().reserve(buffers_->bytes) : nullptr;
}

library_scratch::shared_region library_scratch::take_shared(size_t bytes) {
    if (!bytes) return {};
    std::unique_ptr<buffer> taken;
    {
        const std::lock_guard<std::mutex> lock(buffers_->mutex);
        if (!buffers_->idle_shared.empty()) {
            taken = std::move(buffers_->idle_shared.back());
            buffers_->idle_shared.pop_back();
        }
    }
    if (!taken) taken = std::make_unique<buffer>();
    taken->reserve(bytes); // may throw: `taken` is freed, not lost
    return shared_region(this, taken.release());
}

library_scratch::shared_region::~shared_region() {
    if (!taken_) return;
    std::unique_ptr<buffer> back(taken_);
    const std::lock_guard<std::mutex> lock(owner_->buffers_->mutex);
    try {
        owner_->buffers_->idle_shared.push_back(std::move(back));
    } catch (...) { // no room to keep it: freed
    }
}

char *library_scratch::shared_region::data() const {
    return taken_ ? taken_->data : nullptr;
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
