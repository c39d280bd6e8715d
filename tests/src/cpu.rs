//! CPU time of the processes of a benchmark, read from `/proc` (Linux): the control plane's
//! (etcd, the API servers), the product's and the bench's own, and the whole machine's busy
//! time, so that a bench can say where the time of a phase went.

use std::collections::HashMap;
use std::time::Instant;

use crate::control_plane::ControlPlane;

/// The key of the whole machine's busy CPU seconds in what [`report`] returns.
pub const MACHINE: &str = "machine";

/// Clock ticks per second of `/proc/<pid>/stat` and `/proc/stat` (`USER_HZ`, 100 on Linux).
pub const USER_HZ: f64 = 100.0;

/// CPU time (user + system) of process `pid` so far, in ticks of [`USER_HZ`]; 0 when it is
/// gone.
pub fn process_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // fields after "(comm)": state is field 3, utime 14, stime 15 (proc(5))
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

/// Busy CPU time of the whole machine so far (all but idle and iowait), in ticks.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    total - fields.get(3).copied().unwrap_or(0) - fields.get(4).copied().unwrap_or(0)
}

/// `(name, pid)` of the control plane's processes (etcd, `apiserver-host`,
/// `apiserver-virtual`, …), from its `pids` file; its watchdog is left out.
pub fn control_plane_processes(cp: &ControlPlane) -> Vec<(String, u32)> {
    let pids = std::fs::read_to_string(cp.dir().join("pids")).unwrap_or_default();
    pids.lines()
        .filter_map(|l| {
            let (pid, name) = l.split_once(' ')?;
            let pid = pid.parse().ok()?;
            (name != "watchdog").then(|| (name.to_string(), pid))
        })
        .collect()
}

/// CPU ticks of some processes and of the whole machine, at one moment.
pub struct CpuSnapshot {
    at: Instant,
    procs: Vec<(String, u64)>,
    machine: u64,
}

/// The CPU ticks of `procs` (`(name, pid)`) and of the machine now.
pub fn snapshot(procs: &[(String, u32)]) -> CpuSnapshot {
    CpuSnapshot {
        at: Instant::now(),
        procs: procs
            .iter()
            .map(|(n, pid)| (n.clone(), process_ticks(*pid)))
            .collect(),
        machine: machine_busy_ticks(),
    }
}

/// Prints (stderr) the CPU seconds each process of `a` used until `b`, their sum, and the
/// machine's busy seconds against those available (wall time × cores); returns the seconds
/// by process name, and the machine's busy seconds under [`MACHINE`]. `a` and `b` must be
/// snapshots of the same processes.
pub fn report(what: &str, a: &CpuSnapshot, b: &CpuSnapshot) -> HashMap<String, f64> {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let mut line = format!("cpu {what}: wall {wall:.1} s;");
    let mut ours = 0.0;
    let mut seconds = HashMap::new();
    for ((name, t0), (_, t1)) in a.procs.iter().zip(&b.procs) {
        let s = (t1.saturating_sub(*t0)) as f64 / USER_HZ;
        ours += s;
        seconds.insert(name.clone(), s);
        line += &format!(" {name} {s:.1} s;");
    }
    let machine = (b.machine.saturating_sub(a.machine)) as f64 / USER_HZ;
    line += &format!(
        " these together {ours:.1} s; whole machine {machine:.1} s busy of {:.1} s available",
        wall * cores
    );
    eprintln!("{line}");
    seconds.insert(MACHINE.into(), machine);
    seconds
}

/// Waits until `procs` (`(name, pid)`) are quiet together: a one-second window in which they
/// used at most `max_ticks` ticks of [`USER_HZ`] in all (the control plane settling after its
/// start, a CRD's OpenAPI publication or the previous phase's tail), or `limit` passed.
/// Returns how long it waited and the ticks of the last window, so that a bench can print
/// both: a phase clocked while the control plane is still busy measures that work too.
pub async fn until_quiet(
    procs: &[(String, u32)],
    max_ticks: u64,
    limit: std::time::Duration,
) -> (std::time::Duration, u64) {
    let start = Instant::now();
    loop {
        let t0: u64 = procs.iter().map(|(_, pid)| process_ticks(*pid)).sum();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let used = procs
            .iter()
            .map(|(_, pid)| process_ticks(*pid))
            .sum::<u64>()
            .saturating_sub(t0);
        if used <= max_ticks || start.elapsed() >= limit {
            return (start.elapsed(), used);
        }
    }
}

/// CPU ticks (of [`USER_HZ`]) process `pid` uses over `window`, as a rate per second: its idle
/// rate, when it has nothing to do.
pub async fn idle_rate(pid: u32, window: std::time::Duration) -> f64 {
    let t0 = process_ticks(pid);
    tokio::time::sleep(window).await;
    (process_ticks(pid).saturating_sub(t0)) as f64 / window.as_secs_f64()
}

/// Waits until process `pid` is idle again after a phase: a one-second window with no more
/// than `idle_per_s` (its [`idle_rate`]) plus one tick, or 30 s; returns when. A bench's CPU
/// window ends here, so the process's tail work (echoes of its own writes, status writes) is
/// counted.
pub async fn until_idle(pid: u32, idle_per_s: f64) -> Instant {
    let limit = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let t0 = process_ticks(pid);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let used = process_ticks(pid).saturating_sub(t0) as f64;
        if used <= idle_per_s + 1.0 || Instant::now() > limit {
            return Instant::now();
        }
    }
}
