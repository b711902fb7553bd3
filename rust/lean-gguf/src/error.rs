//! The one error type of this crate: every variant names what was wrong and where.

use crate::TensorType;
use std::fmt;

/// Why a GGUF file (or a metadata lookup, or a [`crate::GgufWriter`] build) was rejected.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with the bytes `GGUF`.
    BadMagic { found: [u8; 4] },
    /// Only versions 2 and 3 are read (version 1 used 32-bit counts and is long gone).
    UnsupportedVersion { version: u32 },
    /// The file ends inside a fixed-size field.
    Truncated {
        context: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// [`crate::Gguf::parse_header`] only: the prefix ends inside the header, but the file is
    /// long enough; retry with at least `needed` bytes (more may be needed after that).
    NeedMoreBytes { have: usize, needed: u64 },
    /// A count or length read from the file cannot fit in the bytes that remain after it.
    LengthBeyondFile {
        context: String,
        what: &'static str,
        length: u64,
        offset: u64,
        remaining: u64,
    },
    /// A metadata value (or array element) type id that GGUF does not define.
    UnknownValueType { context: String, type_id: u32 },
    /// A key, string value or tensor name is not UTF-8.
    InvalidUtf8 { context: String, offset: u64 },
    /// A bool stored as something other than 0 or 1.
    InvalidBool { key: String, byte: u8 },
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`] (bounds the parser's recursion).
    ArrayTooDeep { key: String },
    /// The same metadata key twice.
    DuplicateKey { key: String },
    /// `general.alignment` is zero or not a power of two.
    InvalidAlignment { alignment: u64 },
    /// A tensor with no dimensions or more than 4 (GGML's maximum).
    BadDimCount { tensor: String, n_dims: u32 },
    /// A tensor with a zero dimension (rejected: no model has empty tensors, and every consumer
    /// would otherwise have to handle zero-length rows).
    ZeroDim { tensor: String, dims: Vec<u64> },
    /// The tensor's element count or byte size does not fit in 64 bits.
    ElementCountOverflow { tensor: String, dims: Vec<u64> },
    /// A `ggml_type` id that lean has no kernels for (or that does not exist).
    UnknownTensorType { tensor: String, type_id: u32 },
    /// The row length (`dims[0]`) is not a whole number of the type's blocks.
    RowNotBlockMultiple {
        tensor: String,
        ty: TensorType,
        row_len: u64,
    },
    /// The tensor's size or position does not fit in this platform's `usize` (wasm32: 4 GiB).
    TooLargeForPlatform { tensor: String, bytes: u64 },
    /// Two tensors with the same name.
    DuplicateTensor { tensor: String },
    /// The tensor's data would extend past the end of the file.
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        size: u64,
        file_len: u64,
    },
    /// The tensor's offset (relative to the data section) is not a multiple of the alignment.
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: usize,
    },
    /// Two tensors' data ranges overlap.
    TensorsOverlap {
        first: String,
        second: String,
        first_end: u64,
        second_start: u64,
    },
    /// A required metadata key is absent.
    MissingKey { key: String },
    /// A metadata value has a type the getter cannot convert.
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    /// An integer metadata value does not fit the requested type.
    ValueOutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    /// A required tensor is absent.
    MissingTensor { tensor: String },
    /// [`crate::GgufWriter`]: GGUF arrays are homogeneous.
    MixedArray {
        key: String,
        first: &'static str,
        other: &'static str,
    },
    /// [`crate::GgufWriter`]: the data given does not match the tensor's type and dims.
    TensorDataSize {
        tensor: String,
        expected: u64,
        actual: usize,
    },
}

impl GgufError {
    /// Fills in where a low-level read failed; the closure runs only on the error path, so
    /// callers can describe the location without formatting on every successful read.
    pub(crate) fn context(mut self, describe: impl FnOnce() -> String) -> Self {
        match &mut self {
            GgufError::Truncated { context, .. }
            | GgufError::LengthBeyondFile { context, .. }
            | GgufError::UnknownValueType { context, .. }
            | GgufError::InvalidUtf8 { context, .. }
                if context.is_empty() =>
            {
                *context = describe()
            }
            _ => {}
        }
        self
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::BadMagic { found } => {
                write!(f, "not a GGUF file: magic is {:?}, expected \"GGUF\"", String::from_utf8_lossy(found))
            }
            GgufError::UnsupportedVersion { version } => {
                write!(f, "unsupported GGUF version {version} (only 2 and 3 are supported")?;
                if matches!(version.swap_bytes(), 2 | 3) {
                    f.write_str("; this looks like a big-endian file, which lean does not read")?;
                }
                f.write_str(")")
            }
            GgufError::Truncated { context, offset, needed, file_len } => write!(
                f,
                "GGUF file truncated while reading {context}: needs {needed} bytes at offset {offset}, \
                 but the file is {file_len} bytes"
            ),
            GgufError::NeedMoreBytes { have, needed } => write!(
                f,
                "the GGUF header extends past the {have} bytes given; at least {needed} are needed"
            ),
            GgufError::LengthBeyondFile { context, what, length, offset, remaining } => write!(
                f,
                "{what} {length} of {context} (at offset {offset}) cannot fit in the {remaining} bytes \
                 left in the file"
            ),
            GgufError::UnknownValueType { context, type_id } => {
                write!(f, "unknown GGUF metadata value type {type_id} in {context}")
            }
            GgufError::InvalidUtf8 { context, offset } => {
                write!(f, "{context} (at offset {offset}) is not valid UTF-8")
            }
            GgufError::InvalidBool { key, byte } => {
                write!(f, "metadata key '{key}': bool stored as byte {byte}, expected 0 or 1")
            }
            GgufError::ArrayTooDeep { key } => write!(
                f,
                "metadata key '{key}': arrays nested deeper than {} levels",
                crate::MAX_ARRAY_DEPTH
            ),
            GgufError::DuplicateKey { key } => write!(f, "metadata key '{key}' appears twice"),
            GgufError::InvalidAlignment { alignment } => write!(
                f,
                "general.alignment is {alignment}; it must be a non-zero power of two"
            ),
            GgufError::BadDimCount { tensor, n_dims } => {
                write!(f, "tensor '{tensor}' has {n_dims} dimensions; expected 1 to 4")
            }
            GgufError::ZeroDim { tensor, dims } => {
                write!(f, "tensor '{tensor}' has a zero dimension: {dims:?}")
            }
            GgufError::ElementCountOverflow { tensor, dims } => {
                write!(f, "tensor '{tensor}' with dims {dims:?} is too large: its size overflows 64 bits")
            }
            GgufError::UnknownTensorType { tensor, type_id } => {
                write!(f, "tensor '{tensor}' has unknown or unsupported ggml type id {type_id}")
            }
            GgufError::RowNotBlockMultiple { tensor, ty, row_len } => write!(
                f,
                "tensor '{tensor}': row length {row_len} is not a multiple of {ty}'s block length {}",
                ty.block_len()
            ),
            GgufError::TooLargeForPlatform { tensor, bytes } => write!(
                f,
                "tensor '{tensor}': {bytes} bytes is beyond what this platform can address"
            ),
            GgufError::DuplicateTensor { tensor } => write!(f, "tensor '{tensor}' appears twice"),
            GgufError::TensorOutOfBounds { tensor, offset, size, file_len } => write!(
                f,
                "tensor '{tensor}': {size} bytes at offset {offset} extend past the end of the \
                 {file_len}-byte file"
            ),
            GgufError::MisalignedTensor { tensor, offset, alignment } => write!(
                f,
                "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
            ),
            GgufError::TensorsOverlap { first, second, first_end, second_start } => write!(
                f,
                "tensors '{first}' and '{second}' overlap: '{first}' ends at byte {first_end}, \
                 '{second}' starts at byte {second_start}"
            ),
            GgufError::MissingKey { key } => write!(f, "metadata key '{key}' is missing"),
            GgufError::WrongType { key, expected, found } => {
                write!(f, "metadata key '{key}': expected {expected}, found {found}")
            }
            GgufError::ValueOutOfRange { key, value, target } => {
                write!(f, "metadata key '{key}': value {value} does not fit in {target}")
            }
            GgufError::MissingTensor { tensor } => write!(f, "tensor '{tensor}' is missing"),
            GgufError::MixedArray { key, first, other } => write!(
                f,
                "metadata key '{key}': array mixes {first} and {other}; GGUF arrays hold one type"
            ),
            GgufError::TensorDataSize { tensor, expected, actual } => write!(
                f,
                "tensor '{tensor}': its type and dims need {expected} bytes of data, {actual} given"
            ),
        }
    }
}

impl std::error::Error for GgufError {}
