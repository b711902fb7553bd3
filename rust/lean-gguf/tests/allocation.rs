//! Counts read from a file must be checked against the bytes left before they size an
//! allocation. A tracking allocator records the largest single allocation made while parsing
//! damaged copies of a small file; it must stay proportional to the file's size.
//! (Its own test binary, so other tests' allocations cannot interfere.)

mod common;

use lean_gguf::Gguf;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct TrackLargest;

thread_local! {
    // Const-initialised and without a destructor, so reading it never allocates.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for TrackLargest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.with(|largest| largest.set(largest.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.with(|largest| largest.set(largest.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: TrackLargest = TrackLargest;

#[test]
fn allocations_are_bounded_by_the_file_size() {
    let original = common::sample_file();
    // A Value is 32 bytes and the smallest array element 1 byte; leave room for hash tables.
    let bound = 64 * original.len();
    let mut rng = common::Rng::new(99);
    let mut worst = (0, String::new());
    for round in 0..3000 {
        let mut bytes = original.clone();
        // Overwrite 8 bytes at once with a value of random magnitude, so that whole length and
        // count fields get replaced by plausible and implausible sizes alike.
        let pos = rng.below(bytes.len() - 8);
        let value = rng.next_u64() >> rng.below(64);
        bytes[pos..pos + 8].copy_from_slice(&value.to_le_bytes());
        LARGEST.with(|largest| largest.set(0));
        let _ = Gguf::parse(&bytes);
        let largest = LARGEST.with(Cell::get);
        if largest > worst.0 {
            worst = (largest, format!("round {round}, 8 bytes at {pos}"));
        }
    }
    eprintln!(
        "largest single allocation: {} bytes ({}); file {} bytes",
        worst.0,
        worst.1,
        original.len()
    );
    assert!(
        worst.0 <= bound,
        "{} bytes allocated at once ({}); bound {bound}",
        worst.0,
        worst.1
    );
}
