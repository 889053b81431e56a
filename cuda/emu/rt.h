// Internal to the emulator runtime (fiber.cpp, runtime.cpp): the state of
// the threads of a block, of an OS thread running blocks, and of a launch.
#pragma once
#include "emu.h"

#include <atomic>
#include <condition_variable>
#include <string>
#include <vector>

#include "table.h"

#if !defined(__x86_64__) || defined(ASRFORGE_EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace asrforge_emu {
namespace rt {

constexpr unsigned kMaxThreads = 1024;
constexpr unsigned char kNanByte = 0xFF;
constexpr unsigned char kGuardByte = 0xA5;
constexpr size_t kDefaultDynLimit = 48 * 1024;  // without cuFuncSetAttribute, as on a GPU

enum State : unsigned char { kRunnable, kAtBarrier, kAtWarp, kDone };
enum Schedule { kAsc, kDesc, kRandom };

struct Worker;
struct Launch;

struct Thr {
    ThreadCtx ctx;  // first: the stack header points here
    unsigned lin = 0, lane = 0, warp_id = 0;
    State state = kRunnable;
    bool started = false;
    void* sp = nullptr;
    char* stack = nullptr;
#if !defined(__x86_64__) || defined(ASRFORGE_EMU_UCONTEXT)
    ucontext_t uc;
#endif
    int bar_kind = 0, bar_pred = 0, bar_result = 0;
    const char* bar_file = nullptr;
    int bar_line = 0;
    int wop = 0, warg = 0, wwidth = 32;
    unsigned wmask = 0;
    uint64_t wval = 0, wres = 0;
};

// The first bytes of every fiber stack region (ctx() reads `cur`).
struct StackHdr {
    ThreadCtx* cur;
    Thr* thr;
    Worker* worker;
};

struct Range {
    char* p;
    size_t n;
};

struct Worker {
    void* sched_sp = nullptr;
#if !defined(__x86_64__) || defined(ASRFORGE_EMU_UCONTEXT)
    ucontext_t sched_uc;
#endif
    char* region = nullptr;  // kMaxThreads stacks, aligned to kStackSize
    size_t region_len = 0;
    char* region_map = nullptr;
    unsigned stacks_made = 0;
    std::vector<char*> free_stacks;
    char* tls = nullptr;  // this thread's TLS block of the module
    size_t tls_len = 0;
    std::vector<char*> dyn;     // this thread's `extern __shared__` arrays
    std::vector<Range> statics;  // the TLS block minus the dyn arrays
    std::vector<Thr> thr;
    std::vector<unsigned> order;
    // The block being run.
    Launch* launch = nullptr;
    size_t pos = 0;        // the scheduler's position in `order`
    bool straight = true;  // no thread has synchronised yet in this block
    unsigned n_bar = 0, n_warp = 0, n_done = 0;
    Thr* last = nullptr;  // the thread whose fiber switched back last
    uint3 bid{0, 0, 0};
    bool failed = false;
    std::string err;
};

struct Launch {
    size_t kernel;
    dim3 grid, block;
    unsigned dyn;
    void** args;
    Schedule schedule;
    uint64_t seed;
    uint64_t total;
    std::atomic<uint64_t> next{0};
    std::atomic<bool> stop{false};
    int users = 0;  // pool threads inside run_blocks (under Pool::mu)
    std::string err;  // the first failing block's message (under Pool::mu)
    std::condition_variable idle;
};

// The header of the running fiber's stack, and of a stack region.
inline StackHdr* hdr() { return reinterpret_cast<StackHdr*>(stack_header(stack_region())); }
inline StackHdr* hdr_of(const char* stack) { return reinterpret_cast<StackHdr*>(stack_header(reinterpret_cast<uintptr_t>(stack))); }

// fiber.cpp: switching, stacks, the calling OS thread's worker.
// Starts thread t on its (already assigned) stack: returns when it first waits or ends.
void start_fiber(Worker& w, Thr& t);
// Resumes a started thread from the scheduler.
void to_fiber(Worker& w, Thr& t);
// From a fiber back to the scheduler of its worker.
void to_scheduler(Worker& w, Thr& t);
// From one fiber straight to another of the same block.
void fiber_to_fiber(Thr& from, Thr& to);
// This OS thread's worker (created at its first use).
Worker& worker();
// A free fiber stack of w, or nullptr when none can be mapped.
char* take_stack(Worker& w);
void release_stack(Worker& w, Thr& t);

}  // namespace rt
}  // namespace asrforge_emu

// runtime.cpp: runs the kernel in the fiber of t (and, straight through, the
// following threads); never returns.
extern "C" [[noreturn]] void asrforge_emu_fiber_main(asrforge_emu::rt::Thr* t) __attribute__((visibility("hidden")));
