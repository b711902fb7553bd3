//! Wall-clock seconds for the engine's timings and speculation's cost check. Natively the
//! monotonic `Instant`; wasm32-unknown-unknown has no clock in std, so a host that has one
//! (lean-wasm: the page's or worker's `performance.now()`) registers it with [`set_clock`].
//! Without one every duration reads 0 and the cost check never pauses.

use std::sync::OnceLock;

/// The host's clock: seconds since any fixed origin.
static CLOCK: OnceLock<fn() -> f64> = OnceLock::new();

/// Gives the engine a clock where std has none (the first one registered stays). Natively
/// `Instant` is used whatever is registered.
pub fn set_clock(seconds: fn() -> f64) {
    let _ = CLOCK.set(seconds);
}

/// A point in time, `None` where there is no clock.
pub(crate) fn now() -> Option<f64> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(std::time::Instant::now);
        Some(origin.elapsed().as_secs_f64())
    }
    #[cfg(target_arch = "wasm32")]
    {
        CLOCK.get().map(|clock| clock())
    }
}

/// Seconds since `t` (0 without a clock).
pub(crate) fn since(t: Option<f64>) -> f64 {
    match (t, now()) {
        (Some(t), Some(now)) => (now - t).max(0.0),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_are_measured_natively() {
        let t = super::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let seconds = super::since(t);
        assert!((0.002..1.0).contains(&seconds), "{seconds}");
        assert_eq!(super::since(None), 0.0);
    }
}
