//! A per-op profile of training steps, kept by the tape: for every op kind,
//! forward and backward apart, the number of calls, the wall time, the
//! process CPU time (all threads; steady under a loaded machine where wall
//! time is not) and the bytes of the tensors it produced.
//!
//! Forward: ops do not report when they start, only when they record, so
//! an op's forward time is the time from the previous mark to its record
//! (the forward of an op is everything it did since the one before it
//! recorded). Untracked work in between — masks built from lengths, ops on
//! tensors that need no gradient — is charged to the next recorded op;
//! [`profile_mark`] closes such a stretch under a name of its own.
//! Backward: each node's closure is timed around its call, with the
//! accumulation of the gradients it returns.
//!
//! On a GPU the host clock only sees launches; a device installs a sync
//! hook with [`start_profile`] (a stream synchronisation, or an event
//! recorded and resolved later) that runs before every clock reading, so the
//! same table measures kernels there.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Runs before each clock reading (a device synchronisation on a GPU).
pub type SyncHook = fn();

/// Calls, times and bytes of one op kind in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpStat {
    /// Times the op ran.
    pub calls: u64,
    /// Wall time.
    pub wall: Duration,
    /// CPU time of the whole process (every thread) over the same spans.
    pub cpu: Duration,
    /// Bytes of the tensors it produced (outputs forward, gradients backward).
    pub bytes: u64,
}

impl OpStat {
    fn add(&mut self, wall: Duration, cpu: Duration, bytes: u64) {
        self.calls += 1;
        self.wall += wall;
        self.cpu += cpu;
        self.bytes += bytes;
    }
}

/// The profile gathered since [`start_profile`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Forward, by op name.
    pub forward: HashMap<&'static str, OpStat>,
    /// Backward, by op name.
    pub backward: HashMap<&'static str, OpStat>,
    /// Steps the profile covers (as told by [`profile_step`]), to print per-step figures.
    pub steps: u64,
}

struct State {
    prof: Profile,
    last: (Instant, Duration),
    sync: Option<SyncHook>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// CPU time of the whole process.
fn process_cpu() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID).map(Duration::from).unwrap_or_default()
}

fn now(sync: Option<SyncHook>) -> (Instant, Duration) {
    if let Some(s) = sync {
        s();
    }
    (Instant::now(), process_cpu())
}

/// Starts (or restarts, emptied) this thread's profile; `sync` runs before every clock reading.
pub fn start_profile(sync: Option<SyncHook>) {
    STATE.with(|s| *s.borrow_mut() = Some(State { prof: Profile::default(), last: now(sync), sync }));
}

/// Stops profiling and returns what was gathered (None when it was not started).
pub fn stop_profile() -> Option<Profile> {
    STATE.with(|s| s.borrow_mut().take()).map(|s| s.prof)
}

/// Whether a profile is being gathered on this thread.
pub fn is_profiling() -> bool {
    STATE.with(|s| s.borrow().is_some())
}

/// Counts one more step in the profile.
pub fn profile_step() {
    STATE.with(|s| {
        if let Some(st) = s.borrow_mut().as_mut() {
            st.prof.steps += 1;
        }
    });
}

/// Charges the time since the previous mark to the forward row `name`
/// (work that records nothing, such as the optimizer step) and restarts the clock.
pub fn profile_mark(name: &'static str, bytes: u64) {
    STATE.with(|s| {
        if let Some(st) = s.borrow_mut().as_mut() {
            let t = now(st.sync);
            st.prof.forward.entry(name).or_default().add(t.0 - st.last.0, t.1.saturating_sub(st.last.1), bytes);
            st.last = now(st.sync);
        }
    });
}

/// Restarts the forward clock without charging anyone (the time since is nobody's).
pub fn profile_reset_clock() {
    STATE.with(|s| {
        if let Some(st) = s.borrow_mut().as_mut() {
            st.last = now(st.sync);
        }
    });
}

/// Times `f` as one backward call of `name`; `f` also gives the bytes it produced.
pub(crate) fn time_backward<R>(name: &'static str, f: impl FnOnce() -> (R, u64)) -> R {
    let sync = STATE.with(|s| s.borrow().as_ref().map(|st| st.sync));
    let Some(sync) = sync else { return f().0 };
    let t0 = now(sync);
    let (r, b) = f();
    let t1 = now(sync);
    STATE.with(|s| {
        if let Some(st) = s.borrow_mut().as_mut() {
            st.prof.backward.entry(name).or_default().add(t1.0 - t0.0, t1.1.saturating_sub(t0.1), b);
            // The forward clock restarts after backward work.
            st.last = now(sync);
        }
    });
    r
}

impl Profile {
    /// Adds `other`'s counts to this profile.
    pub fn merge(&mut self, other: &Profile) {
        for (dst, src) in [(&mut self.forward, &other.forward), (&mut self.backward, &other.backward)] {
            for (k, v) in src {
                let e = dst.entry(k).or_default();
                e.calls += v.calls;
                e.wall += v.wall;
                e.cpu += v.cpu;
                e.bytes += v.bytes;
            }
        }
        self.steps += other.steps;
    }

    /// The table, most CPU time first, per step: op, direction, calls,
    /// wall ms, CPU ms, share of all CPU time, MiB produced; `top` rows at most, then the total.
    pub fn table(&self, top: usize) -> String {
        let steps = self.steps.max(1) as f64;
        let mut rows: Vec<(&str, &str, OpStat)> = self.forward.iter().map(|(k, v)| (*k, "fwd", *v)).collect();
        rows.extend(self.backward.iter().map(|(k, v)| (*k, "bwd", *v)));
        rows.sort_by(|a, b| b.2.cpu.cmp(&a.2.cpu).then(a.0.cmp(b.0)));
        let total_cpu: f64 = rows.iter().map(|r| r.2.cpu.as_secs_f64()).sum();
        let total_wall: f64 = rows.iter().map(|r| r.2.wall.as_secs_f64()).sum();
        let total_bytes: u64 = rows.iter().map(|r| r.2.bytes).sum();
        let mut s = format!(
            "per-op profile, per step over {} steps (cpu = process CPU time, every thread)\n{:<24} {:>3} {:>7} {:>9} {:>9} {:>6} {:>9}\n",
            self.steps, "op", "dir", "calls", "wall_ms", "cpu_ms", "cpu%", "MiB"
        );
        for (name, dir, st) in rows.iter().take(top) {
            s += &format!(
                "{:<24} {:>3} {:>7.0} {:>9.2} {:>9.2} {:>5.1}% {:>9.1}\n",
                name,
                dir,
                st.calls as f64 / steps,
                st.wall.as_secs_f64() * 1e3 / steps,
                st.cpu.as_secs_f64() * 1e3 / steps,
                100.0 * st.cpu.as_secs_f64() / total_cpu.max(1e-12),
                st.bytes as f64 / steps / (1 << 20) as f64
            );
        }
        s += &format!(
            "{:<24} {:>3} {:>7} {:>9.2} {:>9.2} {:>5.1}% {:>9.1}\n",
            "total",
            "",
            "",
            total_wall * 1e3 / steps,
            total_cpu * 1e3 / steps,
            100.0,
            total_bytes as f64 / steps / (1 << 20) as f64
        );
        s
    }
}
