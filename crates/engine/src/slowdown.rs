//! An engine made slower on purpose: a phone-class device emulated on this machine.
//!
//! The device–edge benchmark needs a device several times slower than its edge server.
//! A CPU quota on the device's process does that too, but it stalls everything the
//! process does, its network threads included, in quanta of the quota's period (1–10 ms
//! here), so a transfer started just after a long forward waits for the next period. A
//! phone's radio and network stack do not wait for its compute. [`Slowed`] slows the
//! engine alone: after each run it sleeps `(factor − 1)` times the run's own compute, so
//! every graph run takes `factor` times as long while the process's other threads keep
//! the core. The sleep is a pause of the thread that ran the graph, as the compute of a
//! slower processor would be, so what waits for the run waits as long.
//!
//! The run's compute is the CPU time of the thread that ran it, where the engine runs a
//! graph on its caller's thread (one engine thread: tract's single-thread executor, ONNX
//! Runtime without an intra-op pool), not its wall time: a run that another thread of
//! the process preempted (the device's sends and receives share its core) would
//! otherwise have the preemption multiplied by the factor, as if the network threads were
//! the slow processor's. With an engine pool of several threads the caller's CPU time is
//! not the run's, and the wall time is used.
//!
//! What it does not do: make a run's own compute steadier. Whatever stretches it (the
//! other process on the machine, the caches) is stretched `factor` times, as under a CPU
//! quota (docs/results.md, "The device slowed in its engine, not its cgroup").

use crate::workspace::{GraphId, StateUpdates, Workspace};
use crate::{EngineError, EngineKind, Provider, Session, Value};
use std::time::{Duration, Instant};

/// The most a device may be slowed: beyond it a run of milliseconds becomes seconds and
/// the factor is a typo more likely than a device.
pub const MAX_SLOWDOWN: f64 = 100.0;

/// Checks a slowdown factor: finite, at least 1, at most [`MAX_SLOWDOWN`].
pub fn check_slowdown(factor: f64) -> Result<f64, EngineError> {
    if factor.is_finite() && (1.0..=MAX_SLOWDOWN).contains(&factor) {
        Ok(factor)
    } else {
        Err(EngineError::Config(format!("slowdown factor {factor}: must be from 1 (full speed) to {MAX_SLOWDOWN}")))
    }
}

/// The pause after a run that took `ran`, for the run to take `factor` times as long.
pub fn pause_after(ran: Duration, factor: f64) -> Duration {
    ran.mul_f64(factor - 1.0)
}

/// The CPU time the calling thread has used, where the system can tell.
fn thread_cpu_time() -> Option<Duration> {
    let mut t = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: clock_gettime writes a whole timespec into the pointer it is given and
    // touches nothing else; it is read only when the call reports success.
    let t = unsafe {
        if libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, t.as_mut_ptr()) != 0 {
            return None;
        }
        t.assume_init()
    };
    Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

/// What a run's compute is measured by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The CPU time of the calling thread: the engine runs graphs on it.
    CallerCpu,
    /// Wall time: the engine runs graphs on a pool of threads.
    Wall,
}

impl Clock {
    /// The clock for `engine` with `threads` threads (`None`: the machine's cores): the
    /// caller's CPU time where the engine computes on the calling thread alone — tract's
    /// single-thread executor (0 or 1 threads), ONNX Runtime's CPU provider with one
    /// intra-op thread (0 is its default pool) — and the wall time otherwise (a pool, a
    /// GPU, XNNPACK's own threads).
    pub fn for_engine(engine: &EngineKind, threads: Option<usize>) -> Clock {
        let threads = threads.unwrap_or_else(crate::default_threads);
        let on_caller = match engine {
            EngineKind::Tract => threads <= 1,
            EngineKind::Ort(Provider::Cpu) => threads == 1,
            EngineKind::Ort(Provider::Cuda | Provider::Xnnpack) => false,
        };
        if on_caller && thread_cpu_time().is_some() { Clock::CallerCpu } else { Clock::Wall }
    }
}

/// Runs `f`, then sleeps so that the whole takes `factor` times `f`'s compute (by
/// `clock`); adds the compute and the pause to the counters.
fn slowed<T>(factor: f64, clock: Clock, ran: &mut Duration, paused: &mut Duration, f: impl FnOnce() -> T) -> T {
    let cpu = || if clock == Clock::CallerCpu { thread_cpu_time() } else { None };
    let (wall, before) = (Instant::now(), cpu());
    let out = f();
    let took = match (before, cpu()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => wall.elapsed(),
    };
    let slept = Instant::now();
    std::thread::sleep(pause_after(took, factor));
    *ran += took;
    *paused += slept.elapsed();
    out
}

/// A workspace or session whose runs take `factor` times as long as the engine's. A
/// workspace's graph loads are slowed too (tract compiles a graph's plan there); a
/// session is wrapped once loaded.
pub struct Slowed<T> {
    inner: T,
    factor: f64,
    clock: Clock,
    ran: Duration,
    paused: Duration,
}

impl<T> Slowed<T> {
    /// `inner` slowed by `factor` (checked by [`check_slowdown`]), its runs' compute
    /// measured by `clock`.
    pub fn new(inner: T, factor: f64, clock: Clock) -> Result<Slowed<T>, EngineError> {
        Ok(Slowed { inner, factor: check_slowdown(factor)?, clock, ran: Duration::ZERO, paused: Duration::ZERO })
    }

    /// The engine's compute in the runs (and loads) so far, by the clock: tract compiles a
    /// plan at the first run of each batch size, and that is counted too.
    pub fn ran(&self) -> Duration {
        self.ran
    }

    /// The time slept after those runs, as it was slept (a sleep ends late, never early).
    pub fn paused(&self) -> Duration {
        self.paused
    }
}

impl Workspace for Slowed<Box<dyn Workspace>> {
    fn load_graph(&mut self, model: &[u8], updates: StateUpdates) -> Result<GraphId, EngineError> {
        let inner = &mut self.inner;
        slowed(self.factor, self.clock, &mut self.ran, &mut self.paused, || inner.load_graph(model, updates))
    }
    fn inputs(&self, graph: GraphId) -> &[String] {
        self.inner.inputs(graph)
    }
    fn outputs(&self, graph: GraphId) -> &[String] {
        self.inner.outputs(graph)
    }
    fn set_state(&mut self, name: &str, value: Value) -> Result<(), EngineError> {
        self.inner.set_state(name, value)
    }
    fn state(&self, name: &str) -> Result<Value, EngineError> {
        self.inner.state(name)
    }
    fn state_names(&self) -> Vec<String> {
        self.inner.state_names()
    }
    fn run(&mut self, graph: GraphId, inputs: &[(&str, &Value)]) -> Result<Vec<(String, Value)>, EngineError> {
        let inner = &mut self.inner;
        slowed(self.factor, self.clock, &mut self.ran, &mut self.paused, || inner.run(graph, inputs))
    }
    fn unload_graph(&mut self, graph: GraphId) -> Result<(), EngineError> {
        self.inner.unload_graph(graph)
    }
    fn loaded_graphs(&self) -> usize {
        self.inner.loaded_graphs()
    }
    fn take_profile(&mut self, graph: GraphId) -> Result<crate::Profile, EngineError> {
        self.inner.take_profile(graph)
    }
}

impl Session for Slowed<Box<dyn Session>> {
    fn input_names(&self) -> &[String] {
        self.inner.input_names()
    }
    fn output_names(&self) -> &[String] {
        self.inner.output_names()
    }
    fn run(&mut self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>, EngineError> {
        let inner = &mut self.inner;
        slowed(self.factor, self.clock, &mut self.ran, &mut self.paused, || inner.run(inputs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_factor_is_refused_unless_it_is_from_one_to_the_most() {
        for ok in [1.0, 4.0, 10.0, MAX_SLOWDOWN] {
            assert_eq!(check_slowdown(ok).unwrap(), ok);
        }
        for bad in [0.0, 0.5, -2.0, f64::NAN, f64::INFINITY, MAX_SLOWDOWN + 1.0] {
            let e = check_slowdown(bad).unwrap_err().to_string();
            assert!(e.contains("slowdown") && e.contains("from 1"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_engine_on_its_callers_thread_is_timed_by_its_cpu_and_others_by_the_wall() {
        // Linux, where these tests run, has the thread's CPU clock.
        let (tract, ort) = (EngineKind::Tract, EngineKind::Ort(Provider::Cpu));
        assert_eq!(Clock::for_engine(&tract, Some(1)), Clock::CallerCpu);
        assert_eq!(Clock::for_engine(&tract, Some(0)), Clock::CallerCpu);
        assert_eq!(Clock::for_engine(&tract, Some(2)), Clock::Wall);
        assert_eq!(Clock::for_engine(&ort, Some(1)), Clock::CallerCpu);
        assert_eq!(Clock::for_engine(&ort, Some(0)), Clock::Wall, "0 is ONNX Runtime's default pool");
        assert_eq!(Clock::for_engine(&EngineKind::Ort(Provider::Cuda), Some(1)), Clock::Wall);
        let before = thread_cpu_time().unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(thread_cpu_time().unwrap() > before, "{x}");
    }

    #[test]
    fn the_pause_makes_the_run_take_the_factor_times_its_time() {
        let ran = Duration::from_millis(12);
        assert_eq!(pause_after(ran, 1.0), Duration::ZERO);
        assert_eq!(pause_after(ran, 4.0), Duration::from_millis(36));
        assert_eq!(pause_after(ran, 10.0), Duration::from_millis(108));
    }
}
