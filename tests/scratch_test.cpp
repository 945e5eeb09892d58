// The library scratchpad's buffers (src/scratch): what each execute may use alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "src/scratch.hpp"

namespace {

using pagedattn::detail::library_scratch;
using pagedattn::detail::thread_scratch;

// Two executes alive on one thread at once (TBB runs one nested in the other while the outer one
// waits in its loop) must not share their shared region: it once belonged to the calling thread.
TEST(library_scratch, nested_executes_on_one_thread_get_different_shared_regions) {
    library_scratch library(256);
    const thread_scratch outer(&library, 4096);
    std::memset(outer.shared(), 0x11, 4096);
    {
        const thread_scratch inner(&library, 4096);
        ASSERT_NE(inner.shared(), nullptr);
        EXPECT_NE(inner.shared(), outer.shared());
        std::memset(inner.shared(), 0x22, 4096);
    }
    for (int i = 0; i < 4096; ++i)
        ASSERT_EQ(static_cast<unsigned char>(outer.shared()[i]), 0x11) << "byte " << i;
}

TEST(library_scratch, a_finished_execute_gives_its_shared_region_back) {
    library_scratch library(0);
    char *first = nullptr;
    {
        const thread_scratch a(&library, 1000);
        first = a.shared();
        ASSERT_NE(first, nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    }
    const thread_scratch b(&library, 1000); // the pool's buffer, not a new one
    EXPECT_EQ(b.shared(), first);
    const thread_scratch c(&library, 0); // an execute that needs none takes none
    EXPECT_EQ(c.shared(), nullptr);
}

TEST(library_scratch, a_shared_region_grows_to_what_an_execute_asks) {
    library_scratch library(0);
    { const thread_scratch a(&library, 64); }
    const thread_scratch b(&library, 1 << 20);
    std::memset(b.shared(), 0, 1 << 20); // ASan (sanitizer leg) checks the size
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.shared()) % 64, 0u);
}

TEST(library_scratch, the_per_thread_region_is_the_calling_threads) {
    library_scratch library(512);
    const thread_scratch a(&library, 0);
    char *mine = a.get();
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(a.get(), mine); // reused within the thread
    char *other = nullptr;
    std::thread([&] { other = a.get(); }).join();
    EXPECT_NE(other, mine);
}

} // namespace
