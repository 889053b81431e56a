// The emulator's fibers: the context switch (hand-written for x86-64, ucontext
// elsewhere), the fiber stacks, and each OS thread's worker with its view of
// the module's shared memory (its TLS block). See cuda/README.md.
//
// No thread_local here: the module's TLS block is the block's shared memory
// (NaN-filled at every block start), so it must hold nothing else.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "abi.h"
#include "rt.h"

namespace asrforge_emu {
namespace rt {
// ---- context switch --------------------------------------------------------------
#if defined(__x86_64__) && !defined(ASRFORGE_EMU_UCONTEXT)
extern "C" void asrforge_emu_switch(void** save_sp, void* to_sp) __attribute__((visibility("hidden")));
extern "C" void asrforge_emu_fiber_entry() __attribute__((visibility("hidden")));
// Saves the callee-saved registers on the current stack, stores the stack
// pointer in *save_sp, switches to to_sp and restores the registers there.
__asm__(R"(
    .text
    .globl asrforge_emu_switch
    .hidden asrforge_emu_switch
    .type asrforge_emu_switch,@function
asrforge_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size asrforge_emu_switch, .-asrforge_emu_switch
    .globl asrforge_emu_fiber_entry
    .hidden asrforge_emu_fiber_entry
    .type asrforge_emu_fiber_entry,@function
asrforge_emu_fiber_entry:
    movq %r15, %rdi
    call asrforge_emu_fiber_main
    ud2
    .size asrforge_emu_fiber_entry, .-asrforge_emu_fiber_entry
)");

size_t stack_color(const Worker& w, const char* stack);
void to_fiber(Worker& w, Thr& t) { asrforge_emu_switch(&w.sched_sp, t.sp); }
void to_scheduler(Worker& w, Thr& t) { asrforge_emu_switch(&t.sp, w.sched_sp); }
void fiber_to_fiber(Thr& from, Thr& to) { asrforge_emu_switch(&from.sp, to.sp); }
void start_fiber(Worker& w, Thr& t) {
    // Registers popped by the first switch: r15 = &t, then the return address.
    uintptr_t top = reinterpret_cast<uintptr_t>(t.stack) + kStackSize - stack_color(w, t.stack);
    uintptr_t* s = reinterpret_cast<uintptr_t*>(top - 72);
    for (int i = 0; i < 6; ++i) s[i] = 0;
    s[0] = reinterpret_cast<uintptr_t>(&t);
    s[6] = reinterpret_cast<uintptr_t>(&asrforge_emu_fiber_entry);
    t.sp = s;
    to_fiber(w, t);
}
#else
// Portable fallback (about 15x slower per switch: swapcontext saves the signal mask).
void fiber_tramp(unsigned hi, unsigned lo) {
    asrforge_emu_fiber_main(reinterpret_cast<Thr*>((static_cast<uintptr_t>(hi) << 32) | lo));
}
size_t stack_color(const Worker& w, const char* stack);
void to_fiber(Worker& w, Thr& t) { swapcontext(&w.sched_uc, &t.uc); }
void to_scheduler(Worker& w, Thr& t) { swapcontext(&t.uc, &w.sched_uc); }
void fiber_to_fiber(Thr& from, Thr& to) { swapcontext(&from.uc, &to.uc); }
void start_fiber(Worker& w, Thr& t) {
    getcontext(&t.uc);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    t.uc.uc_stack.ss_sp = t.stack + 2 * page;
    t.uc.uc_stack.ss_size = kStackSize - 2 * page - stack_color(w, t.stack);
    t.uc.uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(&t);
    makecontext(&t.uc, reinterpret_cast<void (*)()>(fiber_tramp), 2, (unsigned)(p >> 32), (unsigned)p);
    to_fiber(w, t);
}
#endif

// ---- per-OS-thread worker state -------------------------------------------------------
struct Module {
    void* handle = nullptr;
    size_t tls_len = 0;
};

int phdr_cb(struct dl_phdr_info* info, size_t, void* data) {
    auto* want = static_cast<std::pair<ElfW(Addr), size_t>*>(data);
    if (info->dlpi_addr != want->first) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_TLS) want->second = info->dlpi_phdr[i].p_memsz;
    return 1;
}

Module& module() {
    static Module* m = [] {
        auto* mod = new Module;
        Dl_info di;
        if (dladdr(reinterpret_cast<void*>(&asrforge_emu_abi), &di) && di.dli_fname) {
            // Never unloaded: pool threads sleep inside this library's code.
            mod->handle = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
        }
        if (mod->handle) {
            struct link_map* lm = nullptr;
            if (dlinfo(mod->handle, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
                std::pair<ElfW(Addr), size_t> want(lm->l_addr, 0);
                dl_iterate_phdr(phdr_cb, &want);
                mod->tls_len = want.second;
            }
        }
        return mod;
    }();
    return *m;
}

pthread_key_t worker_key;
pthread_once_t worker_once = PTHREAD_ONCE_INIT;

void free_worker(void* p) {
    Worker* w = static_cast<Worker*>(p);
    if (w->region_map) munmap(w->region_map, w->region_len);
    delete w;
}

Worker& worker() {
    pthread_once(&worker_once, [] { pthread_key_create(&worker_key, free_worker); });
    if (void* p = pthread_getspecific(worker_key)) return *static_cast<Worker*>(p);
    Worker* w = new Worker;
    // Stacks: reserved once (no memory until touched), made usable one by one.
    w->region_len = (size_t)kMaxThreads * kStackSize + kStackSize;
    void* m = mmap(nullptr, w->region_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED) {
        w->region_map = static_cast<char*>(m);
        w->region = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(m) + kStackSize - 1) & ~(kStackSize - 1));
    }
    // This thread's shared memory: the module's TLS block.
    volatile char* anchor = static_cast<char*>(tls_anchor());
    (void)*anchor;
    Module& mod = module();
    void* tls = nullptr;
    if (mod.handle && mod.tls_len && dlinfo(mod.handle, RTLD_DI_TLS_DATA, &tls) == 0 && tls) {
        w->tls = static_cast<char*>(tls);
        w->tls_len = mod.tls_len;
    }
    for (size_t i = 0; i < kDynSharedCount; ++i) w->dyn.push_back(static_cast<char*>(kDynShared[i]()));
    if (w->tls) {
        std::vector<char*> d = w->dyn;
        std::sort(d.begin(), d.end());
        char* at = w->tls;
        char* end = w->tls + w->tls_len;
        for (char* p : d) {
            if (p < at || p >= end) continue;
            if (p > at) w->statics.push_back(Range{at, (size_t)(p - at)});
            at = p + kDynSharedCap + kDynGuard;
        }
        if (at < end) w->statics.push_back(Range{at, (size_t)(end - at)});
    }
    pthread_setspecific(worker_key, w);
    return *w;
}

// Stacks aligned to 256 KiB would put every fiber's frames in the same cache
// sets; each starts at a different offset below its top instead.
size_t stack_color(const Worker& w, const char* stack) {
    const size_t idx = (size_t)(stack - w.region) / kStackSize;
    return (idx * 1088) % 65536;
}

char* take_stack(Worker& w) {
    if (!w.free_stacks.empty()) {
        char* s = w.free_stacks.back();
        w.free_stacks.pop_back();
        return s;
    }
    if (!w.region || w.stacks_made >= kMaxThreads) return nullptr;
    char* s = w.region + (size_t)w.stacks_made++ * kStackSize;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    // [header page][guard page, no access][stack ... top]: an overflow faults.
    if (mprotect(s, page, PROT_READ | PROT_WRITE) != 0 ||
        mprotect(s + 2 * page, kStackSize - 2 * page, PROT_READ | PROT_WRITE) != 0)
        return nullptr;
    return s;
}

void release_stack(Worker& w, Thr& t) {
    if (t.stack) w.free_stacks.push_back(t.stack);
    t.stack = nullptr;
}

}  // namespace rt
}  // namespace asrforge_emu
