// The CUDA-on-CPU runtime linked into every emulated module (lib<stem>.so):
// the threads of a block run as fibers (fiber.cpp) on one OS thread, handing
// off at barriers and warp intrinsics, which this file checks and resolves;
// blocks spread over a pool of OS threads; the ABI entry points.
// See cuda/README.md, "The emulator", and cuda/emu/abi.h for the entry points.
//
// No thread_local here: the module's TLS block is the block's shared memory
// (NaN-filled at every block start), so it must hold nothing else.
#include "emu.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "abi.h"
#include "rt.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace asrforge_emu {
using namespace rt;
namespace {

const char* kernel_name(size_t i) { return kKernels[i].name; }

std::string base_name(const char* f) {
    if (!f) return "?";
    const char* s = strrchr(f, '/');
    return s ? s + 1 : f;
}


// ---- one block ------------------------------------------------------------------------
uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void make_order(Worker& w, const Launch& L, uint64_t block, uint64_t phase) {
    const unsigned n = (unsigned)w.thr.size();
    w.order.resize(n);
    for (unsigned i = 0; i < n; ++i) w.order[i] = L.schedule == kDesc ? n - 1 - i : i;
    if (L.schedule == kRandom) {
        uint64_t st = L.seed ^ (block * 0xD1B54A32D192ED03ull) ^ (phase * 0x8CB92BA72F3D8DD7ull);
        for (unsigned i = n; i > 1; --i) std::swap(w.order[i - 1], w.order[splitmix(st) % i]);
    }
}

std::string where(const Worker& w) {
    const Launch& L = *w.launch;
    char b[256];
    snprintf(b, sizeof b, "kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), block dim (%u,%u,%u)", kernel_name(L.kernel),
             w.bid.x, w.bid.y, w.bid.z, L.grid.x, L.grid.y, L.grid.z, L.block.x, L.block.y, L.block.z);
    return b;
}

std::string tname(const Thr& t) {
    char b[64];
    snprintf(b, sizeof b, "thread (%u,%u,%u)", t.ctx.tid.x, t.ctx.tid.y, t.ctx.tid.z);
    return b;
}

void fail(Worker& w, const std::string& msg) {
    if (w.failed) return;
    w.failed = true;
    w.err = where(w) + ": " + msg;
}

const char* op_name(int op) {
    switch (op) {
        case kWarpSync: return "__syncwarp";
        case kShflIdx: return "__shfl_sync";
        case kShflUp: return "__shfl_up_sync";
        case kShflDown: return "__shfl_down_sync";
        case kShflXor: return "__shfl_xor_sync";
        case kBallot: return "__ballot_sync";
        case kAny: return "__any_sync";
        case kAll: return "__all_sync";
    }
    return "warp intrinsic";
}

unsigned lanes_of(const Worker& w, unsigned warp_id) {
    const unsigned n = (unsigned)w.thr.size(), first = warp_id * 32;
    return n - first >= 32 ? 0xFFFFFFFFu : ((1u << (n - first)) - 1u);
}

// Every lane of a group that met at a warp intrinsic gets its result.
void resolve_warps(Worker& w) {
    for (Thr& t : w.thr) {
        if (t.state != kAtWarp) continue;
        const unsigned exist = lanes_of(w, t.warp_id);
        const unsigned m = t.wmask & exist;
        char b[256];
        if (!(m & (1u << t.lane))) {
            snprintf(b, sizeof b, "%s in %s (lane %u): its mask 0x%08x excludes the calling lane", op_name(t.wop), tname(t).c_str(),
                     t.lane, t.wmask);
            return fail(w, b);
        }
        const int width = t.wwidth;
        if (width < 1 || width > 32 || (width & (width - 1))) {
            snprintf(b, sizeof b, "%s in %s: width %d is not a power of two in 1..32", op_name(t.wop), tname(t).c_str(), width);
            return fail(w, b);
        }
        Thr* lane[32];
        for (unsigned l = 0; l < 32; ++l) {
            lane[l] = nullptr;
            if (!(m & (1u << l))) continue;
            Thr& u = w.thr[t.warp_id * 32 + l];
            lane[l] = &u;
            if (u.state != kAtWarp) {
                snprintf(b, sizeof b, "%s with mask 0x%08x reached by part of warp %u: lane %u (%s) %s", op_name(t.wop), t.wmask,
                         t.warp_id, l, tname(u).c_str(), u.state == kDone ? "had exited" : "waits at __syncthreads");
                return fail(w, b);
            }
            if ((u.wmask & exist) != m || u.wop != t.wop || u.wwidth != width) {
                snprintf(b, sizeof b, "lanes of warp %u meet at different warp intrinsics: lane %u at %s (mask 0x%08x), lane %u at %s (mask 0x%08x)",
                         t.warp_id, t.lane, op_name(t.wop), t.wmask, l, op_name(u.wop), u.wmask);
                return fail(w, b);
            }
        }
        uint64_t vote = 0;
        for (unsigned l = 0; l < 32; ++l)
            if (lane[l] && lane[l]->wval) vote |= 1ull << l;
        const uint64_t members = m;
        for (unsigned l = 0; l < 32; ++l) {
            Thr* u = lane[l];
            if (!u) continue;
            const unsigned seg = l & ~(unsigned)(width - 1);
            unsigned src = l;
            switch (u->wop) {
                case kShflIdx: src = seg + ((unsigned)u->warg & (unsigned)(width - 1)); break;
                case kShflUp: src = (int)l - u->warg < (int)seg ? l : l - (unsigned)u->warg; break;
                case kShflDown: src = l + (unsigned)u->warg >= seg + (unsigned)width ? l : l + (unsigned)u->warg; break;
                case kShflXor: src = (l ^ (unsigned)u->warg) >= seg + (unsigned)width ? l : (l ^ (unsigned)u->warg); break;
                default: break;
            }
            switch (u->wop) {
                case kBallot: u->wres = vote; break;
                case kAny: u->wres = vote != 0; break;
                case kAll: u->wres = vote == members; break;
                case kWarpSync: u->wres = 0; break;
                default:
                    // A lane outside the group (or past the block) gives undefined
                    // bits on a GPU: here all-ones (NaN), so a use shows.
                    u->wres = (src < 32 && lane[src]) ? lane[src]->wval : ~0ull;
            }
        }
        for (unsigned l = 0; l < 32; ++l)
            if (lane[l]) lane[l]->state = kRunnable;
    }
}

void fill_shared(Worker& w, unsigned dyn) {
    for (const Range& r : w.statics) memset(r.p, kNanByte, r.n);
    for (char* d : w.dyn) {
        memset(d, kNanByte, dyn);
        memset(d + dyn, kGuardByte, kDynGuard);
    }
}

void check_guards(Worker& w, unsigned dyn) {
    for (size_t i = 0; i < w.dyn.size(); ++i) {
        const char* g = w.dyn[i] + dyn;
        for (size_t k = 0; k < kDynGuard; ++k) {
            if ((unsigned char)g[k] != kGuardByte) {
                char b[200];
                snprintf(b, sizeof b, "write past the end of dynamic shared memory: byte %zu after the %u bytes the launch asked for was overwritten", k, dyn);
                return fail(w, b);
            }
        }
    }
}

void run_block(Worker& w, Launch& L, uint64_t b) {
    const dim3 g = L.grid, bd = L.block;
    w.launch = &L;
    w.bid = uint3{(unsigned)(b % g.x), (unsigned)((b / g.x) % g.y), (unsigned)(b / ((uint64_t)g.x * g.y))};
    w.failed = false;
    w.err.clear();
    const unsigned n = bd.x * bd.y * bd.z;
    w.thr.resize(n);
    for (unsigned i = 0; i < n; ++i) {
        Thr& t = w.thr[i];
        t.ctx.tid = uint3{i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
        t.ctx.bid = w.bid;
        t.ctx.bdim = bd;
        t.ctx.gdim = g;
        t.lin = i;
        t.lane = i % 32;
        t.warp_id = i / 32;
        t.state = kRunnable;
        t.started = false;
        t.stack = nullptr;
    }
    fill_shared(w, L.dyn);
    uint64_t phase = 0;
    make_order(w, L, b, phase);
    w.straight = true;
    w.n_bar = w.n_warp = w.n_done = 0;
    for (;;) {
        for (w.pos = 0; w.pos < n; ++w.pos) {
            Thr& t = w.thr[w.order[w.pos]];
            if (t.state != kRunnable) continue;
            if (!t.started) {
                t.stack = take_stack(w);
                if (!t.stack) {
                    fail(w, "cannot map a fiber stack (out of memory?)");
                    break;
                }
                StackHdr* h = hdr_of(t.stack);
                h->cur = &t.ctx;
                h->thr = &t;
                h->worker = &w;
                t.started = true;
                start_fiber(w, t);
            } else {
                to_fiber(w, t);
            }
            // Straight through, the fiber may have run later threads on the same
            // stack (advancing w.pos): the one it ran last owns the stack now.
            Thr& last = *w.last;
            if (last.state == kDone) release_stack(w, last);
            if (w.failed) break;
        }
        if (w.failed) break;
        if (w.n_warp) {
            resolve_warps(w);
            if (w.failed) break;
            w.n_warp = 0;
            for (const Thr& t : w.thr) w.n_warp += t.state == kAtWarp;
            continue;
        }
        if (w.n_bar) {
            if (w.n_done) {
                const Thr* exited = nullptr;
                const Thr* waiting = nullptr;
                for (const Thr& t : w.thr) {
                    if (t.state == kDone && !exited) exited = &t;
                    if (t.state == kAtBarrier && !waiting) waiting = &t;
                }
                char bb[400];
                snprintf(bb, sizeof bb, "__syncthreads (%s:%d) reached by %u of %u threads; %s had exited without reaching it",
                         base_name(waiting->bar_file).c_str(), waiting->bar_line, w.n_bar, n, tname(*exited).c_str());
                fail(w, bb);
                break;
            }
            int cnt = 0;
            for (const Thr& t : w.thr) cnt += t.bar_pred;
            for (Thr& t : w.thr) {
                t.bar_result = t.bar_kind == kBarCount ? cnt : t.bar_kind == kBarAnd ? (cnt == (int)n) : t.bar_kind == kBarOr ? (cnt > 0) : 0;
                t.state = kRunnable;
            }
            w.n_bar = 0;
            ++phase;
            if (L.schedule == kRandom) make_order(w, L, b, phase);
            continue;
        }
        break;  // every thread has finished
    }
    if (!w.failed) check_guards(w, L.dyn);
    if (w.failed)
        for (Thr& t : w.thr)
            if (t.started && t.state != kDone) release_stack(w, t);
}

// ---- the pool -------------------------------------------------------------------------
struct Pool {
    std::mutex mu;
    std::condition_variable work;
    std::deque<Launch*> jobs;
    unsigned threads = 0;
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: its threads outlive static destructors
    return *p;
}

void run_blocks(Worker& w, Launch& L) {
    for (;;) {
        if (L.stop.load(std::memory_order_relaxed)) return;
        const uint64_t b = L.next.fetch_add(1);
        if (b >= L.total) return;
        run_block(w, L, b);
        if (w.failed) {
            Pool& p = pool();
            std::lock_guard<std::mutex> g(p.mu);
            if (L.err.empty()) L.err = w.err;
            L.stop = true;
        }
    }
}

void pool_thread() {
    Pool& p = pool();
    Worker& w = worker();
    std::unique_lock<std::mutex> lk(p.mu);
    for (;;) {
        p.work.wait(lk, [&] { return !p.jobs.empty(); });
        Launch* L = p.jobs.front();
        ++L->users;
        lk.unlock();
        run_blocks(w, *L);
        lk.lock();
        auto it = std::find(p.jobs.begin(), p.jobs.end(), L);
        if (it != p.jobs.end()) p.jobs.erase(it);
        if (--L->users == 0) L->idle.notify_all();
    }
}

unsigned env_threads() {
    const char* s = getenv("ASRFORGE_EMU_THREADS");
    if (s && *s) {
        const long v = strtol(s, nullptr, 10);
        if (v >= 1 && v <= 1024) return (unsigned)v;
    }
    const unsigned h = std::thread::hardware_concurrency();
    return h ? h : 1;
}

void ensure_threads(Pool& p, unsigned want) {
    // Called under p.mu. The caller runs blocks too, so want - 1 helpers.
    while (p.threads + 1 < want) {
        std::thread(pool_thread).detach();
        ++p.threads;
    }
}

int put_err(char* err, size_t len, const std::string& msg) {
    if (err && len) {
        const size_t n = std::min(len - 1, msg.size());
        memcpy(err, msg.data(), n);
        err[n] = 0;
    }
    return 1;
}

// A thread that waits hands over to the next runnable, started thread of this
// pass directly (one switch instead of two through the scheduler); at the end
// of the pass, or before a thread that still needs a stack, to the scheduler.
void switch_away(Worker& w, Thr& t) {
    const size_t n = w.order.size();
    while (w.pos + 1 < n) {
        Thr& nx = w.thr[w.order[w.pos + 1]];
        if (nx.state != kRunnable) {
            ++w.pos;
            continue;
        }
        if (!nx.started) break;
        ++w.pos;
        fiber_to_fiber(t, nx);
        return;
    }
    w.last = &t;
    to_scheduler(w, t);
}

}  // namespace

// ---- called from kernel code (inside a fiber) ------------------------------------------
int barrier(int kind, int pred, const char* file, int line) {
    StackHdr* h = hdr();
    Thr& t = *h->thr;
    Worker& w = *h->worker;
    w.straight = false;
    ++w.n_bar;
    t.state = kAtBarrier;
    t.bar_kind = kind;
    t.bar_pred = pred;
    t.bar_file = file;
    t.bar_line = line;
    switch_away(w, t);
    return t.bar_result;
}

uint64_t warp(int op, unsigned mask, uint64_t value, int arg, int width) {
    StackHdr* h = hdr();
    Thr& t = *h->thr;
    Worker& w = *h->worker;
    w.straight = false;
    ++w.n_warp;
    t.state = kAtWarp;
    t.wop = op;
    t.wmask = mask;
    t.wval = value;
    t.warg = arg;
    t.wwidth = width;
    switch_away(w, t);
    return t.wres;
}

unsigned warp_lanes() {
    StackHdr* h = hdr();
    return lanes_of(*h->worker, h->thr->warp_id);
}

void trap(const char* what, const char* file, int line) {
    StackHdr* h = hdr();
    Thr& t = *h->thr;
    char b[512];
    snprintf(b, sizeof b, "%s failed at %s:%d in %s", what, base_name(file).c_str(), line, tname(t).c_str());
    fail(*h->worker, b);
    h->worker->last = &t;
    to_scheduler(*h->worker, t);
    __builtin_unreachable();
}

}  // namespace asrforge_emu

using namespace asrforge_emu;
using namespace asrforge_emu::rt;

extern "C" [[noreturn]] void asrforge_emu_fiber_main(Thr* t) {
    StackHdr* h = hdr();
    Worker& w = *h->worker;
    for (;;) {
        kKernels[w.launch->kernel].tramp(w.launch->args);
        t->state = kDone;
        ++w.n_done;
        // No thread of the block has synchronised: run the next one in order on
        // this stack, without a switch (a later barrier is an error anyway).
        if (!w.straight || w.pos + 1 >= w.thr.size()) break;
        Thr* next = &w.thr[w.order[w.pos + 1]];
        if (next->started || next->state != kRunnable) break;
        ++w.pos;
        next->started = true;
        next->stack = t->stack;
        t->stack = nullptr;
        h->cur = &next->ctx;
        h->thr = next;
        t = next;
    }
    w.last = t;
    to_scheduler(w, *t);
    __builtin_unreachable();
}

EXPORT int asrforge_emu_abi(void) { return ASRFORGE_EMU_ABI; }
EXPORT size_t asrforge_emu_kernel_count(void) { return kKernelCount; }
EXPORT const char* asrforge_emu_kernel_name(size_t i) { return i < kKernelCount ? kKernels[i].name : nullptr; }

EXPORT int asrforge_emu_launch(size_t i, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned dyn_shared_bytes, void** args, char* err, size_t err_len) {
    if (i >= kKernelCount) return put_err(err, err_len, "asrforge_emu_launch: kernel index " + std::to_string(i) + " out of range (" + std::to_string(kKernelCount) + " kernels)");
    const std::string name = kKernels[i].name;
    const uint64_t threads = (uint64_t)bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || gy > 65535 || gz > 65535 || gx > 0x7FFFFFFFu)
        return put_err(err, err_len, "kernel " + name + ": invalid grid (" + std::to_string(gx) + "," + std::to_string(gy) + "," + std::to_string(gz) + ")");
    if (threads == 0 || threads > kMaxThreads || bx > 1024 || by > 1024 || bz > 64)
        return put_err(err, err_len, "kernel " + name + ": invalid block (" + std::to_string(bx) + "," + std::to_string(by) + "," + std::to_string(bz) + "): at most 1024 threads, z at most 64");
    size_t limit = kDefaultDynLimit;
    if (const char* s = getenv("ASRFORGE_EMU_MAX_DYN_SHARED")) {
        const unsigned long long v = strtoull(s, nullptr, 10);
        if (v > 0) limit = (size_t)std::min<unsigned long long>(v, kDynSharedCap);
    }
    if (dyn_shared_bytes > limit)
        return put_err(err, err_len, "kernel " + name + ": too much dynamic shared memory: the launch asks for " + std::to_string(dyn_shared_bytes) +
                                         " bytes, the limit is " + std::to_string(limit));
    Schedule sched = kAsc;
    if (const char* s = getenv("ASRFORGE_EMU_SCHEDULE"); s && *s) {
        if (!strcmp(s, "asc")) sched = kAsc;
        else if (!strcmp(s, "desc")) sched = kDesc;
        else if (!strcmp(s, "random")) sched = kRandom;
        else return put_err(err, err_len, std::string("ASRFORGE_EMU_SCHEDULE: expected asc, desc or random, found \"") + s + "\"");
    }
    uint64_t seed = 0;
    if (const char* s = getenv("ASRFORGE_EMU_SEED"); s && *s) {
        char* end = nullptr;
        seed = strtoull(s, &end, 10);
        if (*end) return put_err(err, err_len, std::string("ASRFORGE_EMU_SEED: expected an unsigned integer, found \"") + s + "\"");
    }
    Launch L;
    L.kernel = i;
    L.grid = dim3(gx, gy, gz);
    L.block = dim3(bx, by, bz);
    L.dyn = dyn_shared_bytes;
    L.args = args;
    L.schedule = sched;
    L.seed = seed;
    L.total = (uint64_t)gx * gy * gz;
    Pool& p = pool();
    const bool share = L.total > 1;
    if (share) {
        std::lock_guard<std::mutex> g(p.mu);
        if (p.threads == 0) ensure_threads(p, env_threads());
        if (p.threads > 0) {
            p.jobs.push_back(&L);
            p.work.notify_all();
        }
    }
    Worker& w = worker();
    run_blocks(w, L);
    {
        std::unique_lock<std::mutex> lk(p.mu);
        auto it = std::find(p.jobs.begin(), p.jobs.end(), &L);
        if (it != p.jobs.end()) p.jobs.erase(it);
        L.idle.wait(lk, [&] { return L.users == 0; });
        if (!L.err.empty()) return put_err(err, err_len, L.err);
    }
    return 0;
}
