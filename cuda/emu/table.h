// Included by the module table that build.rs generates for each cuda/<stem>.cu:
// the trampoline that calls a kernel with parameter p read from args[p]
// (cuLaunchKernel's kernelParams), its types deduced from the function.
#pragma once
#include <stddef.h>
#include <type_traits>
#include <utility>

namespace asrforge_emu {
struct KernelEntry {
    const char* name;
    void (*tramp)(void** args);
};
template <typename... P, size_t... I> inline void call_kernel(void (*f)(P...), void** a, std::index_sequence<I...>) {
    f(*static_cast<typename std::decay<P>::type*>(a[I])...);
}
template <typename... P> inline void invoke(void (*f)(P...), void** a) { call_kernel(f, a, std::index_sequence_for<P...>{}); }
template <auto F> void tramp(void** a) { invoke(F, a); }

// Defined by the generated table.
extern const KernelEntry kKernels[];
extern const size_t kKernelCount;
// This thread's copy of each `extern __shared__` array of the module.
extern void* (*const kDynShared[])();
extern const size_t kDynSharedCount;
// The address of a thread_local of the module: touching it makes the loader
// allocate this thread's TLS block (the block's shared memory).
void* tls_anchor();
}  // namespace asrforge_emu
