//! lean's patch (not in upstream minijinja): bounds on the bytes a render may create.
//!
//! Fuel bounds instructions, not bytes: one `~`, `*`, `replace`, `join` or `indent` may double,
//! square or multiply what it is given, so a 60-byte template could ask for terabytes, and
//! a failed allocation aborts the process (or kills a wasm instance). With limits set (see
//! [`with_limits`]), every operator and builtin that can make a value larger than its inputs
//! asks [`charge`] first, before it allocates: no single value may exceed
//! [`Limits::value_bytes`], and all the bytes so created (and what the caller's formatter
//! charges for output) may not exceed [`Limits::total_bytes`]. Without limits nothing changes.
//!
//! Fuel does not bound time either: one instruction may do work in proportion to its values
//! (`s|upper`, `l|sort`, `'y' in s` on a 1 MB string, 100,000 times in a loop of a few bytes).
//! A deadline ([`Limits::deadline`]) is checked every [`TICKS_PER_CLOCK`] instructions.
//!
//! The limits are per thread because renders are synchronous and the operators see no state.
use std::cell::Cell;
use std::fmt;

use crate::error::{Error, ErrorKind};
use crate::value::Value;

/// What a render may create, and until when it may run (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest string (in bytes) or list (at [`ITEM_BYTES`] an item) one operation may make.
    pub value_bytes: usize,
    /// All bytes charged during the render.
    pub total_bytes: usize,
    /// When the render must stop, if ever.
    pub deadline: Option<Deadline>,
}

/// A time on the caller's clock (the caller's: `std::time::Instant` panics on some targets).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// The clock, in milliseconds.
    pub now_ms: fn() -> f64,
    /// The render stops once the clock passes this.
    pub at_ms: f64,
}

/// Instructions between two readings of the deadline's clock: a reading costs tens of
/// nanoseconds, and one instruction at most a few milliseconds (its values are bounded).
pub const TICKS_PER_CLOCK: u32 = 16;

/// Which limit stopped a render, and the size that was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// One value would have had this many bytes.
    Value(usize),
    /// The render would have created this many bytes in all.
    Total(usize),
    /// The render ran past its deadline.
    Time,
}

/// What a render charged: bytes in all, and the limit it hit (if it was stopped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes charged in all.
    pub charged: usize,
    /// The first limit that refused a charge.
    pub exceeded: Option<Exceeded>,
}

/// The bytes a list item is charged: the size of a `Value`.
pub const ITEM_BYTES: usize = std::mem::size_of::<Value>();

thread_local! {
    static LIMITS: Cell<Option<Limits>> = const { Cell::new(None) };
    static USAGE: Cell<Usage> = const { Cell::new(Usage { charged: 0, exceeded: None }) };
    static TICKS: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` (a render) under `limits`, and returns its result with what it charged. Nested
/// calls restore the outer limits and usage when they return (or unwind).
pub fn with_limits<R>(limits: Limits, f: impl FnOnce() -> R) -> (R, Usage) {
    struct Restore(Option<Limits>, Usage);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMITS.set(self.0);
            USAGE.set(self.1);
        }
    }
    let _restore = Restore(LIMITS.replace(Some(limits)), USAGE.take());
    let result = f();
    (result, USAGE.get())
}

/// Asks to create one value of `bytes` bytes: refused past either limit.
pub fn charge(bytes: usize) -> Result<(), Error> {
    check_value(bytes)?;
    charge_total(bytes)
}

/// Asks to create a list of `items` items, or a lazy one that would yield that many: only the
/// value limit applies (a lazy list holds its parts, not copies).
pub fn check_items(items: usize) -> Result<(), Error> {
    check_value(items.saturating_mul(ITEM_BYTES))
}

/// Refuses one value of `bytes` bytes past the value limit, charging nothing.
pub fn check_value(bytes: usize) -> Result<(), Error> {
    match LIMITS.get() {
        Some(limits) if bytes > limits.value_bytes => Err(exceeded(Exceeded::Value(bytes))),
        _ => Ok(()),
    }
}

/// Adds `bytes` to the render's total, refused past the total limit.
pub fn charge_total(bytes: usize) -> Result<(), Error> {
    let Some(limits) = LIMITS.get() else {
        return Ok(());
    };
    let mut usage = USAGE.get();
    usage.charged = usage.charged.saturating_add(bytes);
    USAGE.set(usage);
    if usage.charged > limits.total_bytes {
        return Err(exceeded(Exceeded::Total(usage.charged)));
    }
    Ok(())
}

/// Counts an instruction; every [`TICKS_PER_CLOCK`]th reads the clock, refused past the deadline.
pub fn tick() -> Result<(), Error> {
    let ticks = TICKS.get().wrapping_add(1);
    TICKS.set(ticks);
    if ticks % TICKS_PER_CLOCK != 0 {
        return Ok(());
    }
    match LIMITS.get().and_then(|limits| limits.deadline) {
        Some(deadline) if (deadline.now_ms)() > deadline.at_ms => Err(exceeded(Exceeded::Time)),
        _ => Ok(()),
    }
}

fn exceeded(what: Exceeded) -> Error {
    let mut usage = USAGE.get();
    usage.exceeded.get_or_insert(what);
    USAGE.set(usage);
    let message = match what {
        Exceeded::Value(bytes) => format!("a value of {bytes} bytes is over the template's limit"),
        Exceeded::Total(bytes) => {
            format!("the template created {bytes} bytes, over its limit")
        }
        Exceeded::Time => "the template ran past its deadline".to_string(),
    };
    Error::new(ErrorKind::InvalidOperation, message)
}

/// Charges `text.replace(from, to)` before it is built: its size is known.
pub fn charge_replace(text: &str, from: &str, to: &str) -> Result<(), Error> {
    if to.len() > from.len() {
        let count = text.matches(from).count();
        let grown = count.saturating_mul(to.len() - from.len());
        charge(text.len().saturating_add(grown))?;
    }
    Ok(())
}

/// A writer that charges what passes through it as one value, and stops at the limits: the
/// way to display a value whose text may be far larger than the value (a list that holds the
/// same long string many times).
pub struct Charged<W> {
    inner: W,
    written: usize,
    error: Option<Error>,
}

impl<W: fmt::Write> Charged<W> {
    /// Charges what is written to `inner`.
    pub fn new(inner: W) -> Self {
        Charged {
            inner,
            written: 0,
            error: None,
        }
    }

    /// The writer back, or the limit's error when a write was refused. (A `fmt::Error` of the
    /// inner writer is the caller's to report.)
    pub fn finish(self, result: fmt::Result) -> Result<W, Error> {
        match (self.error, result) {
            (Some(error), _) => Err(error),
            (None, Ok(())) => Ok(self.inner),
            (None, Err(_)) => Err(Error::new(ErrorKind::WriteFailure, "formatting failed")),
        }
    }
}

impl<W: fmt::Write> fmt::Write for Charged<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.written = self.written.saturating_add(s.len());
        if let Err(error) = check_value(self.written).and_then(|()| charge_total(s.len())) {
            self.error = Some(error);
            return Err(fmt::Error);
        }
        self.inner.write_str(s)
    }
}

/// `items` displayed one after another with `joiner` between them (the `join` filter's text,
/// and pycompat's `str.join`), charged as it is written: a list may hold one long string many
/// times.
pub fn join(items: impl Iterator<Item = Value>, joiner: &str) -> Result<String, Error> {
    use fmt::Write;
    let mut out = Charged::new(String::new());
    let written = items.enumerate().try_for_each(|(i, item)| {
        if i > 0 {
            out.write_str(joiner)?;
        }
        match item.as_str() {
            Some(text) => out.write_str(text),
            None => write!(out, "{item}"),
        }
    });
    out.finish(written)
}

/// `value`'s `Display` text, charged as it is written (see [`Charged`]).
pub fn to_string(value: &(impl fmt::Display + ?Sized)) -> Result<String, Error> {
    use fmt::Write;
    let mut out = Charged::new(String::new());
    let result = write!(out, "{value}");
    out.finish(result)
}

/// `value`'s `Debug` text (pretty), charged as it is written.
pub fn to_debug_string(value: &(impl fmt::Debug + ?Sized)) -> Result<String, Error> {
    use fmt::Write;
    let mut out = Charged::new(String::new());
    let result = write!(out, "{value:#?}");
    out.finish(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        value_bytes: 100,
        total_bytes: 250,
        deadline: None,
    };

    #[test]
    fn values_and_totals_are_bounded_only_inside_with_limits() {
        assert!(charge(1 << 40).is_ok());
        let ((), usage) = with_limits(LIMITS, || {
            assert!(charge(100).is_ok());
            assert!(charge(101).is_err());
            assert!(charge(100).is_ok());
            assert!(charge(51).is_err());
        });
        assert_eq!(usage.charged, 251);
        assert_eq!(usage.exceeded, Some(Exceeded::Value(101)));
        assert!(charge(1 << 40).is_ok());
    }

    #[test]
    fn charged_display_stops_at_the_value_limit() {
        let ((), usage) = with_limits(LIMITS, || {
            assert_eq!(to_string("short").unwrap(), "short");
            let long = "x".repeat(60);
            assert!(to_string(&format_args!("{long}{long}")).is_err());
        });
        assert_eq!(usage.exceeded, Some(Exceeded::Value(120)));
    }

    #[test]
    fn the_deadline_is_read_every_few_ticks() {
        fn late() -> f64 {
            2.0
        }
        let deadline = Some(Deadline {
            now_ms: late,
            at_ms: 1.0,
        });
        let ((), usage) = with_limits(Limits { deadline, ..LIMITS }, || {
            let refused = (0..TICKS_PER_CLOCK).filter(|_| tick().is_err()).count();
            assert_eq!(refused, 1);
        });
        assert_eq!(usage.exceeded, Some(Exceeded::Time));
        assert!((0..TICKS_PER_CLOCK).all(|_| tick().is_ok()));
    }

    #[test]
    fn nested_limits_restore_the_outer_ones() {
        let ((), outer) = with_limits(LIMITS, || {
            charge(10).unwrap();
            let ((), inner) = with_limits(LIMITS, || charge(20).unwrap());
            assert_eq!(inner.charged, 20);
            charge(10).unwrap();
        });
        assert_eq!(outer.charged, 20);
    }
}
