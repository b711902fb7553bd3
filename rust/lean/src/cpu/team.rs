//! A team of threads that stays hot for a whole decode step.
//!
//! A decode step of a small model is a few milliseconds cut into ~5 dependent stages per layer.
//! As rayon fork-joins, every stage wakes the pool and waits for it (measured on the 2-core dev
//! VM by `cargo run --release -p lean --example sync_cost`: ~µs each, BENCHMARKS.md). Instead
//! every pool thread runs the same step program once per token (`rayon::broadcast`), takes its
//! share of each stage's rows by its index, and meets the others at a spinning barrier between
//! stages: tens of nanoseconds when the team is balanced.
//!
//! One team runs at a time: a second session asking for the team while it is busy (a server with
//! several conversations, tests in parallel) runs its step alone on its own thread instead —
//! never waiting on a pool thread that may itself be waiting for it. Every row's arithmetic is the
//! same whoever computes it, so the result does not depend on the team's size.
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One member's view of the team.
pub struct Team<'a> {
    index: usize,
    size: usize,
    barrier: &'a SpinBarrier,
}

impl Team<'_> {
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits until every member has reached this point: what any member wrote before it is
    /// visible to all after it.
    pub fn sync(&self) {
        if self.size > 1 {
            self.barrier.wait();
        }
    }

    /// This member's contiguous share of `0..total`, cut at multiples of `align` (the last share
    /// takes the remainder).
    pub fn share(&self, total: usize, align: usize) -> Range<usize> {
        let units = total.div_ceil(align);
        let start = (units * self.index / self.size * align).min(total);
        let end = (units * (self.index + 1) / self.size * align).min(total);
        start..end
    }
}

/// Runs `step` on every member of the team (the pool's threads), or on a team of one (this
/// thread) when the pool has one thread or another team is running.
pub fn run(step: impl Fn(&Team) + Sync) {
    #[cfg(feature = "threads")]
    {
        static BUSY: AtomicBool = AtomicBool::new(false);
        let size = rayon::current_num_threads();
        if size > 1
            && BUSY
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            struct Release;
            impl Drop for Release {
                fn drop(&mut self) {
                    BUSY.store(false, Ordering::Release);
                }
            }
            let _release = Release;
            let barrier = SpinBarrier::new(size);
            rayon::broadcast(|ctx| {
                // A member that panics must not leave the others spinning: it poisons the
                // barrier, they panic in turn, and broadcast re-raises the first panic.
                let guard = PoisonOnUnwind(&barrier);
                step(&Team {
                    index: ctx.index(),
                    size: ctx.num_threads(),
                    barrier: &barrier,
                });
                std::mem::forget(guard);
            });
            return;
        }
    }
    let barrier = SpinBarrier::new(1);
    step(&Team {
        index: 0,
        size: 1,
        barrier: &barrier,
    });
}

#[cfg(feature = "threads")]
struct PoisonOnUnwind<'a>(&'a SpinBarrier);

#[cfg(feature = "threads")]
impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.poisoned.store(true, Ordering::Release);
    }
}

/// Spin iterations before a waiting member starts yielding its core (a few microseconds: the
/// stages of a balanced team end within that of each other; a member descheduled by an
/// oversubscribed machine should not be fought for the core).
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// A reusable barrier for a fixed number of members that spins instead of sleeping.
pub struct SpinBarrier {
    size: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl SpinBarrier {
    pub fn new(size: usize) -> Self {
        SpinBarrier {
            size,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
        }
    }

    pub fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.size {
            // Last to arrive: reset the count before releasing the others, so that none can
            // arrive at the next barrier before it is ready.
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.poisoned.load(Ordering::Acquire) {
                panic!("another member of the decode team panicked");
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                #[cfg(not(target_family = "wasm"))]
                std::thread::yield_now();
                #[cfg(target_family = "wasm")]
                std::hint::spin_loop();
            }
        }
    }
}

/// A slice that the members of a team write in disjoint parts between barriers.
pub struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: access goes through the unsafe methods below, whose callers keep writes disjoint and
// separated from reads of the same elements by `Team::sync`.
unsafe impl<T: Send> Sync for Shared<'_, T> {}
unsafe impl<T: Send> Send for Shared<'_, T> {}

impl<'a, T> Shared<'a, T> {
    pub fn new(slice: &'a mut [T]) -> Self {
        Shared {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// # Safety
    /// No other member writes any element of `range` until the next `Team::sync`, and no other
    /// member reads or writes it while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part_mut(&self, range: Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
    }

    /// # Safety
    /// No member writes any element of `range` while the returned slice lives.
    pub unsafe fn part(&self, range: Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts(self.ptr.add(range.start), range.end - range.start)
    }

    /// # Safety
    /// As `part`, for the whole slice.
    pub unsafe fn all(&self) -> &[T] {
        self.part(0..self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_range_in_order() {
        let barrier = SpinBarrier::new(1);
        for (total, align, size) in [
            (0, 16, 2),
            (10, 16, 2),
            (576, 16, 2),
            (577, 16, 3),
            (3, 1, 2),
        ] {
            let mut next = 0;
            for index in 0..size {
                let team = Team {
                    index,
                    size,
                    barrier: &barrier,
                };
                let r = team.share(total, align);
                assert_eq!(r.start, next, "{total} {align} {size}");
                assert!(r.start == total || r.start.is_multiple_of(align));
                next = r.end;
            }
            assert_eq!(next, total);
        }
    }

    #[test]
    fn members_see_each_others_writes_after_sync() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            let mut data = vec![0usize; 300];
            let shared = Shared::new(&mut data);
            for round in 1..50 {
                run(|team| {
                    let mine = team.share(shared.len(), 1);
                    // SAFETY: shares are disjoint; all reads come after the sync.
                    unsafe { team_round(team, &shared, mine, round) };
                });
            }
        });
    }

    unsafe fn team_round(team: &Team, shared: &Shared<usize>, mine: Range<usize>, round: usize) {
        for v in shared.part_mut(mine.clone()) {
            *v = round;
        }
        team.sync();
        assert!(shared.all().iter().all(|&v| v == round));
        team.sync();
    }

    #[test]
    fn a_panicking_member_does_not_hang_the_team() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                run(|team| {
                    if team.index() == 1 {
                        panic!("member 1 fails");
                    }
                    team.sync();
                })
            })
        }));
        assert!(result.is_err());
        // The team is usable again.
        pool.install(|| run(|team| team.sync()));
    }
}
