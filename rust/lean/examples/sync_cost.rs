//! What one synchronisation of the CPU decode costs: a rayon fork-join over the pool (how every
//! stage of a decode step used to run), a `team::run` (one per token now) and a team barrier
//! (one per stage now). `cargo run --release -p lean --example sync_cost [THREADS]`
use lean::cpu::team;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 20_000;

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("THREADS is a number"))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    println!("{threads} threads, median of 5 runs of {ROUNDS} each, µs per operation:");
    pool.install(|| {
        report("rayon fork-join (par_iter over the pool)", || {
            (0..threads).into_par_iter().for_each(|i| {
                black_box(i);
            })
        });
        report("team::run (broadcast, one per token)", || {
            team::run(|t| {
                black_box(t.index());
            })
        });
        // The barrier alone: ROUNDS syncs inside one team.
        let mut runs: Vec<f64> = (0..5)
            .map(|_| {
                let start = Instant::now();
                team::run(|t| {
                    for _ in 0..ROUNDS {
                        t.sync();
                    }
                });
                start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        println!("  {:<45} {:8.3}", "team barrier (one per stage)", runs[2]);
    });
}

fn report(what: &str, op: impl Fn()) {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..ROUNDS {
                op();
            }
            start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    println!("  {what:<45} {:8.3}", runs[2]);
}
