//! GGUF (v2, v3) reader over a byte slice: metadata, tensor infos, zero-copy tensor views;
//! plus a small writer.
//!
//! # The format
//! A GGUF file is little-endian:
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 metadata_count
//! metadata_count × { string key, u32 value_type, value }
//! tensor_count   × { string name, u32 n_dims, n_dims × u64 dim, u32 ggml_type, u64 offset }
//! padding to `alignment`, then the data section: each tensor's bytes at data_start + offset
//! ```
//! Strings are a u64 byte length and UTF-8 bytes. Value types are u8, i8, u16, i16, u32, i32,
//! f32, bool, string, array, u64, i64, f64 (ids 0..=12); an array is a u32 element type, a
//! u64 length and the elements (arrays may nest). `general.alignment` (u32) sets the
//! alignment, 32 by default. Dims are in GGML order: `dims[0]` is the contiguous row length.
//! Versions 2 and 3 are identical for little-endian files (3 added big-endian files, which are
//! not read here).
//!
//! # What is validated
//! [`Gguf::parse`] never panics, and checks every count read from the file against the bytes
//! left before allocating for it. Each problem is its own [`GgufError`] variant naming the key,
//! tensor or offset: bad magic, unsupported version, truncation anywhere, counts and lengths
//! larger than the rest of the file, unknown value types, invalid UTF-8 (an error, not replaced:
//! see `Reader::string`), bools other than 0/1, arrays nested deeper than [`MAX_ARRAY_DEPTH`],
//! duplicate keys, a `general.alignment` that is not a power-of-two u32; per tensor: 1 to 4 dims, no zero dim, element count and size within 64 bits (and within
//! `usize`, which is 32 bits on wasm32), a known type, a row length that is a whole number of
//! blocks, a unique name, an aligned offset, data inside the file and not overlapping another
//! tensor's. Tensor data itself (e.g. NaNs) is not inspected.
//!
//! The library reads from `&[u8]` only: natively the caller memory-maps the file, on wasm it is
//! a `Vec`. [`Gguf::parse_header`] parses from a prefix for streaming loads.

mod error;
mod parse;
pub mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use parse::{Gguf, TensorInfo};
pub use types::TensorType;
pub use value::{Metadata, Value, ValueType};
pub use writer::GgufWriter;

/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// GGML tensors have at most this many dimensions.
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted (an array of arrays is depth 2); bounds parser recursion.
pub const MAX_ARRAY_DEPTH: usize = 16;
