//! The multi-thread build (feature `threads`): lean's rayon pool runs on Web Workers that share
//! this module's memory, through wasm-bindgen-rayon.
//!
//! JS calls `await initThreadPool(n)` once, before the first `WasmEngine` is built; the engine's
//! forward passes then run on the `n` pool threads while the thread that called into the engine
//! blocks (`Atomics.wait`): that thread must be a dedicated Web Worker, since a page's main
//! thread may not block.

use wasm_bindgen::prelude::*;

/// `initThreadPool(n: number): Promise<void>` starts `n` Web Workers as rayon's global pool.
/// Call it before anything runs on rayon: without a pool, rayon falls back to a one-thread
/// pool on the calling thread, and the global pool can only be set once.
pub use wasm_bindgen_rayon::init_thread_pool;

/// The number of threads that forward passes run on: `n` once `initThreadPool(n)` resolved.
/// Called before it, it fixes the pool at one thread and `initThreadPool` then throws.
#[wasm_bindgen(js_name = threadCount)]
pub fn thread_count() -> usize {
    rayon::current_num_threads()
}
