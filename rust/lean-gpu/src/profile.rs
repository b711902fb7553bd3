//! `LEAN_GPU_PROFILE=1` (native only): where a session's GPU time goes. Every plan the session
//! submits is encoded with a timestamp before each dispatch (TIMESTAMP_QUERY_INSIDE_PASSES),
//! read back after the pass (blocking: profiling costs the pipelining of decode), and summed
//! per dispatch name (kernel, type and shape); the table goes to stderr when the session ends.
use crate::context::GpuContext;
use crate::plan::Plan;
use std::collections::BTreeMap;
use std::future::Future;

/// Features the profiler needs; GpuContext asks for them when `requested()`.
pub(crate) const FEATURES: wgpu::Features =
    wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);

/// Whether LEAN_GPU_PROFILE is set (never in a browser: no blocking readback there).
pub(crate) fn requested() -> bool {
    static REQUESTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REQUESTED.get_or_init(|| {
        !cfg!(target_arch = "wasm32") && std::env::var_os("LEAN_GPU_PROFILE").is_some()
    })
}

#[derive(Default)]
struct Totals {
    passes: u64,
    /// Per dispatch name: (calls, nanoseconds).
    dispatches: BTreeMap<String, (u64, f64)>,
}

pub(crate) struct Profiler {
    set: wgpu::QuerySet,
    capacity: u32,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// Per phase ("decode", "prefill 128", ...).
    phases: BTreeMap<String, Totals>,
}

/// Timestamps per query set: wgpu's limit.
const MAX_QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

impl Profiler {
    /// A profiler when LEAN_GPU_PROFILE is set and the device has the timestamp features
    /// (else None, saying why on stderr).
    pub(crate) fn from_env(ctx: &GpuContext) -> Option<Self> {
        if !requested() {
            return None;
        }
        if !ctx.features().contains(FEATURES) {
            eprintln!("lean-gpu profile: the adapter lacks {FEATURES:?}; not profiling");
            return None;
        }
        let size = MAX_QUERIES as u64 * 8;
        let buffer = |label, usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(Profiler {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("lean profile"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_QUERIES,
            }),
            capacity: MAX_QUERIES,
            resolved: buffer(
                "profile timestamps",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            staging: buffer(
                "profile readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            phases: BTreeMap::new(),
        })
    }

    /// Encodes `plan` with timestamps and their copy to the readback buffer; `None` when the plan
    /// has more dispatches than a query set holds (it is then encoded plainly, unprofiled).
    pub(crate) fn encode(&self, plan: &Plan, encoder: &mut wgpu::CommandEncoder) -> Option<u32> {
        let n = plan.timestamps();
        if n > self.capacity {
            plan.encode(encoder);
            return None;
        }
        plan.encode_profiled(encoder, &self.set);
        encoder.resolve_query_set(&self.set, 0..n, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.staging, 0, n as u64 * 8);
        Some(n)
    }

    /// Waits for the submitted pass encoded by `encode` (which returned `Some(n)`) and adds its
    /// dispatches' times to `phase`.
    pub(crate) fn collect(&mut self, ctx: &GpuContext, phase: &str, plan: &Plan, n: u32) {
        let map = ctx.request_map(&self.staging);
        if ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .is_err()
        {
            return;
        }
        // The wait above ran the map callback: the read is ready at its first poll.
        let read = std::pin::pin!(ctx.read_mapped(&map, &self.staging, n as usize * 8));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(Ok(bytes)) = read.poll(&mut cx) else {
            return;
        };
        let ticks: &[u64] = bytemuck::cast_slice(&bytes);
        let period = ctx.queue.get_timestamp_period() as f64;
        let totals = self.phases.entry(phase.to_string()).or_default();
        totals.passes += 1;
        for (name, pair) in plan.dispatch_names().zip(ticks.windows(2)) {
            let entry = totals.dispatches.entry(name.to_string()).or_default();
            entry.0 += 1;
            entry.1 += pair[1].wrapping_sub(pair[0]) as f64 * period;
        }
    }

    /// The table: per phase, each dispatch name's calls and GPU time per pass, largest first.
    pub(crate) fn report(&self) -> String {
        let mut out = String::new();
        for (phase, t) in &self.phases {
            let passes = t.passes.max(1) as f64;
            let total: f64 = t.dispatches.values().map(|d| d.1).sum();
            let calls: u64 = t.dispatches.values().map(|d| d.0).sum();
            out += &format!(
                "lean-gpu profile · {phase}: {} passes · {:.1} µs GPU and {:.0} dispatches per pass\n",
                t.passes,
                total / passes / 1e3,
                calls as f64 / passes
            );
            let mut rows: Vec<_> = t.dispatches.iter().collect();
            rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            for (name, (n, ns)) in rows {
                out += &format!(
                    "  {:>9.1} µs {:>5.1}%  {:>6.1}×  {:>8.2} µs each  {name}\n",
                    ns / passes / 1e3,
                    100.0 * ns / total.max(1.0),
                    *n as f64 / passes,
                    ns / *n as f64 / 1e3
                );
            }
        }
        out
    }
}
