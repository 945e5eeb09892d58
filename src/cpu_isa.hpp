// ISA detection and caps. Detection runs once (CPUID + XCR0, AMX permission); the environment cap
// PAGEDATTN_MAX_CPU_ISA is read once. Neither calls into oneDNN, so the application's own
// dnnl::set_max_cpu_isa stays free.
#pragma once

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

/// The level an implementation may use for a primitive created with `attr`:
/// min(host, environment cap, attribute cap).
cpu_isa effective_cpu_isa(const primitive_attr &attr);

/// Why the host is at get_host_cpu_isa() and not higher: the first feature it lacks (a CPUID
/// bit, the OS's register state, Linux's AMX permission); empty on an AMX host.
const char *host_cpu_isa_limit();

/// Parses "avx2", "AVX512_bf16", "all", ... Returns false for an unknown name.
bool parse_cpu_isa(const char *name, cpu_isa &isa);

} // namespace detail
} // namespace pagedattn
