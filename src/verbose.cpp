#include "verbose.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace pagedattn {
namespace {

std::atomic<int> &verbose_level() {
    static std::atomic<int> level([] {
        const char *value = std::getenv("PAGEDATTN_VERBOSE");
        return value ? std::atoi(value) : 0;
    }());
    return level;
}

} // namespace

int get_verbose() {
    return verbose_level().load(std::memory_order_relaxed);
}
void set_verbose(int level) {
    verbose_level().store(level, std::memory_order_relaxed);
}

namespace detail {

void verbose_print(const std::string &line) {
    const std::string whole = "pagedattn_verbose," + line + "\n";
    std::fwrite(whole.data(), 1, whole.size(), stderr);
}

std::string milliseconds_since(std::chrono::steady_clock::time_point start) {
    const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    char text[32];
    std::snprintf(text, sizeof text, "%.4f", ms);
    return text;
}

std::string attr_string(const primitive_attr &attr) {
    std::string out;
    const int k = attr.get_scales_mask(ARG_K_CACHE), v = attr.get_scales_mask(ARG_V_CACHE);
    if (k >= 0 || v >= 0) {
        out += "attr-scales:";
        if (k >= 0) out += "k_cache:" + std::to_string(k);
        if (k >= 0 && v >= 0) out += "+";
        if (v >= 0) out += "v_cache:" + std::to_string(v);
        out += " ";
    }
    out += attr.get_fpmath_mode() == fpmath_mode::strict ? "attr-fpmath:strict" : "attr-fpmath:bf16";
    if (attr.get_scratchpad_mode() == scratchpad_mode::user) out += " attr-scratchpad:user";
    if (attr.get_max_cpu_isa() != cpu_isa::all)
        out += std::string(" attr-isa:") + cpu_isa_name(attr.get_max_cpu_isa());
    return out;
}

} // namespace detail
} // namespace pagedattn
