//! Kernel throughput on the real models' matrix shapes, per tensor type, kernel path and thread
//! count: matvec (decode) and matmul over 512 tokens (prefill), in GMAC/s (multiply-adds per
//! second) and, for matvec, GB/s of weight bytes read; then `vecmat` on a decode step's attention.
//!
//! cargo run --release -p lean-quant --example kernel_bench -- [--types Q4_0,Q8_0] [--isa avx2]
//!     [--threads 1,2] [--tokens 512] [--no-matmul] [--columns 1,2,4,8]
//!
//! `--columns` adds `matvec_columns` (speculative decoding's verification pass, one thread) on
//! the verification shapes: its time for k activation columns against k single-column matvecs
//! (what a path without a multi-column kernel runs), both in units of one matvec.
//!
//! `LEAN_VNNI=0` keeps the avx512 path's Q4_0/Q4_1 matvec on its f32 kernels instead of the
//! VNNI limb kernels, for comparing the two.

use lean_quant::{F32Matrix, Isa, TensorType, COLUMN_BLOCK};
use std::time::{Duration, Instant};

/// (rows, cols) = (outputs, inputs): SmolLM2-135M's q/o, k/v, gate/up, down and tied LM head,
/// Qwen2.5-0.5B's MLP.
const SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
    (896, 4864),
    (4864, 896),
];

struct Options {
    types: Vec<TensorType>,
    isas: Vec<Isa>,
    threads: Vec<usize>,
    tokens: usize,
    matmul: bool,
    columns: Vec<usize>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        types: ["Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "F32", "F16"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect(),
        isas: Isa::available().to_vec(),
        threads: vec![1, 2],
        tokens: 512,
        matmul: true,
        columns: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--no-matmul" {
            options.matmul = false;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let list = || value.split(',').map(str::trim).filter(|s| !s.is_empty());
        match flag.as_str() {
            "--types" => options.types = list().map(str::parse).collect::<Result<_, _>>()?,
            "--isa" => {
                options.isas = list()
                    .map(|name| {
                        Isa::available()
                            .iter()
                            .copied()
                            .find(|isa| isa.name() == name)
                            .ok_or_else(|| format!("kernel path '{name}' is not available here"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--threads" => {
                options.threads = list()
                    .map(|n| n.parse().map_err(|e| format!("--threads {n}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--columns" => {
                options.columns = list()
                    .map(|n| match n.parse() {
                        Ok(0) | Err(_) => Err(format!("--columns {n}: not a column count")),
                        Ok(n) => Ok(n),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--tokens" => {
                options.tokens = value
                    .parse()
                    .map_err(|e| format!("--tokens {value}: {e}"))?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(options)
}

/// Deterministic weights with finite scales (random quant bits, f16 scales ~0.01).
fn weights(ty: TensorType, rows: usize, cols: usize) -> Vec<u8> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n_bytes = ty.row_bytes(cols).unwrap() * rows;
    let mut w: Vec<u8> = (0..n_bytes).map(|_| next() as u8).collect();
    let small_float = |bits: u64| 0.01 * ((bits % 2001) as f32 / 1000.0 - 1.0);
    match ty {
        TensorType::F32 => w
            .chunks_exact_mut(4)
            .for_each(|e| e.copy_from_slice(&small_float(next()).to_le_bytes())),
        TensorType::F16 => w.chunks_exact_mut(2).for_each(|e| {
            e.copy_from_slice(&half::f16::from_f32(small_float(next())).to_le_bytes())
        }),
        TensorType::BF16 => w.chunks_exact_mut(2).for_each(|e| {
            e.copy_from_slice(&half::bf16::from_f32(small_float(next())).to_le_bytes())
        }),
        _ => {
            let fields: &[usize] = match ty {
                TensorType::Q2_K => &[80, 82],
                TensorType::Q3_K => &[108],
                TensorType::Q6_K => &[208],
                TensorType::Q4_1 | TensorType::Q5_1 | TensorType::Q4_K | TensorType::Q5_K => {
                    &[0, 2]
                }
                _ => &[0],
            };
            for block in w.chunks_exact_mut(ty.block_bytes()) {
                for &at in fields {
                    block[at..at + 2]
                        .copy_from_slice(&half::f16::from_f32(small_float(next())).to_le_bytes());
                }
            }
        }
    }
    w
}

/// Best time of repeated runs of `f`, repeating for at least `budget` (and at least twice).
fn best_time(budget: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut runs = 0;
    while runs < 2 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        runs += 1;
    }
    best
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("kernel_bench: {e}");
            std::process::exit(2);
        }
    };
    // No pool for one thread: wasm32-wasip1 (the simd128 kernels run under Node's WASI, see
    // scripts/wasi-run.mjs) cannot start threads.
    let pools: Vec<(usize, Option<rayon::ThreadPool>)> = options
        .threads
        .iter()
        .map(|&n| {
            let pool = (n > 1).then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .expect("thread pool")
            });
            (n, pool)
        })
        .collect();
    let n = options.tokens;
    println!(
        "default path: {}; matmul over {n} tokens",
        lean_quant::isa()
    );
    println!(
        "{:<8} {:<5} {:>11} {:>3} | {:>9} {:>7} {:>7} | {:>9} {:>7}",
        "path", "type", "rows x cols", "thr", "matvec us", "GB/s", "GMAC/s", "matmul ms", "GMAC/s"
    );
    for &ty in &options.types {
        for &(rows, cols) in &SHAPES {
            if cols % ty.block_len() != 0 {
                println!(
                    "{:<8} {:<5} {:>5}x{:<5} (cols not whole {}-element blocks)",
                    "-",
                    ty.name(),
                    rows,
                    cols,
                    ty.block_len()
                );
                continue;
            }
            let w = weights(ty, rows, cols);
            let x: Vec<f32> = (0..cols * n)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mut y = vec![0f32; rows * n];
            let macs = (rows * cols) as f64;
            for &isa in &options.isas {
                for (threads, pool) in &pools {
                    in_pool(pool.as_ref(), || {
                        let mv = best_time(Duration::from_millis(300), || {
                            isa.matvec(ty, &w, rows, cols, &x[..cols], &mut y[..rows])
                        });
                        let mv_s = mv.as_secs_f64();
                        let (mm_ms, mm_gmacs) = if options.matmul {
                            let mm = best_time(Duration::from_millis(600), || {
                                isa.matmul(ty, &w, rows, cols, &x, n, &mut y)
                            });
                            let s = mm.as_secs_f64();
                            (
                                format!("{:9.2}", s * 1e3),
                                format!("{:7.1}", macs * n as f64 / s / 1e9),
                            )
                        } else {
                            ("-".into(), "-".into())
                        };
                        println!(
                            "{:<8} {:<5} {:>5}x{:<5} {:>3} | {:9.1} {:7.2} {:7.2} | {:>9} {:>7}",
                            isa.name(),
                            ty.name(),
                            rows,
                            cols,
                            threads,
                            mv_s * 1e6,
                            w.len() as f64 / mv_s / 1e9,
                            macs / mv_s / 1e9,
                            mm_ms,
                            mm_gmacs
                        );
                    });
                }
            }
        }
    }
    attention_bench(&options, &pools);
    if !options.columns.is_empty() {
        columns_bench(&options);
    }
}

/// (rows, cols) of a verification pass's matrices: SmolLM2-135M's q/o, gate/up, down and tied
/// LM head, Qwen2.5-0.5B's q/o, gate/up and down (the downs the only ones K-quants fit).
const COLUMN_SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
    (896, 896),
    (4864, 896),
    (896, 4864),
];

/// `matvec_columns` for each `--columns` count k on one thread, against the same k columns
/// as k `matvec_serial` calls (the fallback: `rows` per column, which also splits each
/// column's activations again on the limb kernels) and one `matvec_serial` (the unit).
fn columns_bench(options: &Options) {
    let most = options.columns.iter().copied().max().unwrap_or(1);
    println!("matvec_columns (one thread; times in units of one matvec)");
    println!(
        "{:<8} {:<5} {:>11} {:>3} | {:>9} {:>10} {:>6} | {:>11} {:>6}",
        "path", "type", "rows x cols", "k", "matvec us", "columns us", "x1", "k matvec us", "x1"
    );
    for &ty in &options.types {
        for &(rows, cols) in &COLUMN_SHAPES {
            if cols % ty.block_len() != 0 {
                continue;
            }
            let w = weights(ty, rows, cols);
            let x: Vec<f32> = (0..cols * most)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mut y = vec![vec![0f32; rows]; most];
            for &isa in &options.isas {
                let one = best_time(Duration::from_millis(300), || {
                    isa.matvec_serial(ty, &w, rows, cols, &x[..cols], &mut y[0])
                })
                .as_secs_f64();
                for &k in &options.columns {
                    let x = &x[..k * cols];
                    let together = best_time(Duration::from_millis(300), || {
                        let mut ys: Vec<&mut [f32]> =
                            y[..k].iter_mut().map(|y| y.as_mut_slice()).collect();
                        isa.matvec_columns(ty, &w, rows, cols, x, &mut ys)
                    })
                    .as_secs_f64();
                    let apart = best_time(Duration::from_millis(300), || {
                        for (xc, y) in x.chunks_exact(cols).zip(y.iter_mut()) {
                            isa.matvec_serial(ty, &w, rows, cols, xc, y)
                        }
                    })
                    .as_secs_f64();
                    println!(
                        "{:<8} {:<5} {:>5}x{:<5} {:>3} | {:9.1} {:10.1} {:6.2} | {:11.1} {:6.2}",
                        isa.name(),
                        ty.name(),
                        rows,
                        cols,
                        k,
                        one * 1e6,
                        together * 1e6,
                        together / one,
                        apart * 1e6,
                        apart / one
                    );
                }
            }
        }
    }
}

/// Runs `f` in `pool`, or on this thread.
fn in_pool(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() + Send) {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// `vecmat` on one decode step's attention for one kv head of SmolLM2-135M at 544 positions:
/// three query heads times the transposed keys (column-blocked, as the KV cache stores them),
/// then their probabilities times the values (row-major).
fn attention_bench(options: &Options, pools: &[(usize, Option<rayon::ThreadPool>)]) {
    let (heads, head_dim, positions): (usize, usize, usize) = (3, 64, 544);
    let blocks = positions.div_ceil(COLUMN_BLOCK);
    let keys: Vec<f32> = (0..blocks * COLUMN_BLOCK * head_dim)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let values = keys[..positions * head_dim].to_vec();
    let q: Vec<f32> = keys[..heads * head_dim].to_vec();
    let p: Vec<f32> = keys[..heads * positions].to_vec();
    let mut y = vec![0f32; heads * positions];
    println!("vecmat (decode attention, {heads} heads x {positions} positions x {head_dim})");
    for &isa in &options.isas {
        // vecmat runs on the calling thread: one pool is enough.
        in_pool(pools[0].1.as_ref(), || {
            let keys_t = F32Matrix::column_blocked(&keys, head_dim, positions, head_dim);
            let scores = best_time(Duration::from_millis(300), || {
                isa.vecmat(&q, heads, keys_t, &mut y[..heads * positions])
            });
            let values = F32Matrix::row_major(&values, positions, head_dim, head_dim);
            let output = best_time(Duration::from_millis(300), || {
                isa.vecmat(&p, heads, values, &mut y[..heads * head_dim])
            });
            let macs = (heads * head_dim * positions) as f64;
            for (what, t) in [("q x keys_t", scores), ("p x values", output)] {
                let s = t.as_secs_f64();
                println!(
                    "{:<8} {:<10} {:9.2} us {:7.2} GMAC/s",
                    isa.name(),
                    what,
                    s * 1e6,
                    macs / s / 1e9
                );
            }
        });
    }
}
