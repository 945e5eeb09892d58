#include "cpu_isa.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#define PAGEDATTN_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace pagedattn {
namespace {

#ifdef PAGEDATTN_X86
uint64_t read_xcr0() {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux keeps AMX tile data disabled until the process asks for it.
bool request_amx_permission() {
#if defined(__linux__)
    constexpr long arch_req_xcomp_perm = 0x1023;
    constexpr long xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;
#endif
}

// The host's level, and why it is not the next one (PAGEDATTN_VERBOSE=3 prints it for the
// implementations above the host).
struct host_detection {
    cpu_isa isa;
    const char *limit;
};

host_detection detect_host() {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return { cpu_isa::generic, "CPUID leaf 1 is unavailable" };
    const bool fma = ecx & (1u << 12), osxsave = ecx & (1u << 27), f16c = ecx & (1u << 29);
    if (!osxsave) return { cpu_isa::generic, "the OS does not enable XSAVE (no AVX)" };
    const uint64_t xcr0 = read_xcr0();
    if ((xcr0 & 0x6) != 0x6) return { cpu_isa::generic, "the OS does not save AVX state (XCR0)" };
    unsigned max_leaf = __get_cpuid_max(0, nullptr);
    if (max_leaf < 7) return { cpu_isa::generic, "CPUID leaf 7 is unavailable (no AVX2)" };
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const bool avx2 = ebx & (1u << 5);
    const bool avx512f = ebx & (1u << 16), avx512bw = ebx & (1u << 30), avx512vl = ebx & (1u << 31);
    const bool avx512_vbmi = ecx & (1u << 1);
    const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
    const unsigned leaf7_subleaves = eax;
    bool avx512_bf16 = false;
    if (leaf7_subleaves >= 1) {
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        avx512_bf16 = a1 & (1u << 5);
    }
    if (!(avx2 && fma && f16c)) return { cpu_isa::generic, "the CPU lacks AVX2, FMA or F16C" };
    if (!(avx512f && avx512bw && avx512vl)) return { cpu_isa::avx2, "the CPU lacks AVX512F/BW/VL" };
    if ((xcr0 & 0xE0) != 0xE0) return { cpu_isa::avx2, "the OS does not save AVX-512 state (XCR0)" };
    // The avx512_bf16 tier decodes FP8 by byte tables (AVX512-VBMI): every CPU with AVX512-BF16
    // has VBMI but Cooper Lake, which x64:avx512 then serves.
    if (!avx512_bf16 || !avx512_vbmi) return { cpu_isa::avx512, "the CPU lacks AVX512-BF16 or AVX512-VBMI" };
    if (!(amx_bf16 && amx_tile))
        return { cpu_isa::avx512_bf16, "the CPU lacks AMX-TILE or AMX-BF16 (CPUID)" };
    if ((xcr0 & 0x60000) != 0x60000)
        return { cpu_isa::avx512_bf16, "the OS does not enable AMX tile state (XCR0 bits 17-18)" };
    if (!request_amx_permission())
        return { cpu_isa::avx512_bf16, "Linux refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)" };
    return { cpu_isa::amx, "" };
}
#else
host_detection detect_host() {
    return { cpu_isa::generic, "not an x86 CPU" };
}
#endif

const host_detection &host() {
    static const host_detection detected = detect_host();
    return detected;
}

cpu_isa read_environment_cap() {
    const char *value = std::getenv("PAGEDATTN_MAX_CPU_ISA");
    if (!value || !*value) return cpu_isa::all;
    cpu_isa isa;
    if (detail::parse_cpu_isa(value, isa)) return isa;
    std::fprintf(
            stderr,
            "pagedattn: ignoring PAGEDATTN_MAX_CPU_ISA=%s (expected generic, avx2, avx512, avx512_bf16, amx "
            "or all)\n",
            value);
    return cpu_isa::all;
}

} // namespace

const char *cpu_isa_name(cpu_isa isa) {
    switch (isa) {
        case cpu_isa::generic: return "generic";
        case cpu_isa::avx2: return "avx2";
        case cpu_isa::avx512: return "avx512";
        case cpu_isa::avx512_bf16: return "avx512_bf16";
        case cpu_isa::amx: return "amx";
        case cpu_isa::all: return "all";
    }
    return "unknown";
}

cpu_isa get_host_cpu_isa() {
    return host().isa;
}

cpu_isa get_max_cpu_isa() {
    static const cpu_isa cap = read_environment_cap();
    return std::min(get_host_cpu_isa(), cap);
}

namespace detail {

bool parse_cpu_isa(const char *name, cpu_isa &isa) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    for (cpu_isa candidate : { cpu_isa::generic, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::avx512_bf16,
                               cpu_isa::amx, cpu_isa::all }) {
        if (lower == cpu_isa_name(candidate)) {
            isa = candidate;
            return true;
        }
    }
    return false;
}

const char *host_cpu_isa_limit() {
    return host().limit;
}

cpu_isa effective_cpu_isa(const primitive_attr &attr) {
    return std::min(get_max_cpu_isa(), attr.get_max_cpu_isa());
}

} // namespace detail
} // namespace pagedattn
