//! The validating parser: [`Gguf::parse`] / [`Gguf::parse_header`], tensor infos and the typed
//! metadata getters.

use crate::value::{Metadata, Value, ValueType};
use crate::{GgufError, TensorType, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use std::collections::HashSet;

/// Smallest possible metadata entry: empty key (8-byte length), type id (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest possible tensor info: empty name (8), n_dims (4), one dim (8), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A parsed GGUF file: everything but the tensor data, which stays in the caller's bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    pub version: u32,
    /// Alignment of the data section and of every tensor in it (`general.alignment`, default 32).
    pub alignment: usize,
    pub metadata: Metadata,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section (the end of the header, padded to `alignment`).
    pub data_offset: usize,
}

/// One tensor's name, shape, type and where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the row length (the contiguous dimension), 1 to 4 entries.
    pub dims: Vec<u64>,
    pub ty: TensorType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Size of the data in bytes.
    pub size: usize,
}

impl TensorInfo {
    // The parser checked that the element count and the size fit in usize, so the products and
    // casts below cannot overflow for parsed tensors.

    pub fn n_elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }

    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> usize {
        self.dims[0] as usize
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.size / self.rows()
    }
}

impl Gguf {
    /// Parses and validates a whole file, including that every tensor's data lies inside it.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        Self::parse_header(bytes, bytes.len() as u64)
    }

    /// Parses the metadata and tensor infos from the first bytes of a file that is `file_len`
    /// bytes long, for loads that stream the tensor data afterwards. Validation is the same as
    /// [`Gguf::parse`]'s (tensor bounds are checked against `file_len`). When `prefix` ends inside
    /// the header and the file is longer, returns [`GgufError::NeedMoreBytes`] saying how many
    /// bytes are needed at least; retry with a longer prefix. Bytes of `prefix` past `file_len`
    /// are ignored.
    pub fn parse_header(prefix: &[u8], file_len: u64) -> Result<Gguf, GgufError> {
        let usable = usize::try_from(file_len).map_or(prefix.len(), |len| len.min(prefix.len()));
        let mut reader = Reader {
            bytes: &prefix[..usable],
            pos: 0,
            file_len,
        };
        reader.parse_file()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Like [`Gguf::tensor`], for loaders: a missing tensor is an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            tensor: name.to_string(),
        })
    }

    /// The tensor's bytes inside `bytes`, the file this was parsed from.
    ///
    /// Panics if `bytes` is shorter than that file (a caller bug, not bad input: parsing
    /// already checked the tensor lies inside the file).
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], info: &TensorInfo) -> &'a [u8] {
        match bytes.get(info.offset..info.offset + info.size) {
            Some(data) => data,
            None => panic!(
                "tensor '{}' spans bytes {}..{} but only {} bytes were given: not the parsed file",
                info.name,
                info.offset,
                info.offset + info.size,
                bytes.len()
            ),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, GgufError> {
        value.ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// An integer of any GGUF type whose value fits in u32.
    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        self.required(key, self.u32_opt(key)?)
    }

    pub fn u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let wide = value
            .as_i128()
            .ok_or_else(|| wrong_type(key, "an integer", value))?;
        u32::try_from(wide)
            .map(Some)
            .map_err(|_| GgufError::ValueOutOfRange {
                key: key.to_string(),
                value: value.to_string(),
                target: "u32",
            })
    }

    /// An F32, or an F64 rounded to f32.
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        self.required(key, self.f32_opt(key)?)
    }

    pub fn f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match *value {
            Value::F32(v) => Ok(Some(v)),
            Value::F64(v) => Ok(Some(v as f32)),
            _ => Err(wrong_type(key, "f32 or f64", value)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        self.required(key, self.str_opt(key)?)
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&str>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        value
            .as_str()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "a string", value))
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        value
            .as_bool()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "a bool", value))
    }

    /// An array of any element type.
    pub fn array(&self, key: &str) -> Result<&[Value], GgufError> {
        let value = self.required(key, self.get(key))?;
        value
            .as_array()
            .ok_or_else(|| wrong_type(key, "an array", value))
    }

    /// An array of strings (an empty array of any type is an empty list).
    pub fn string_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let value = self.required(key, self.get(key))?;
        let items = value
            .as_array()
            .ok_or_else(|| wrong_type(key, "an array of strings", value))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| wrong_type(key, "an array of strings", value))
            })
            .collect()
    }

    /// `general.architecture`, e.g. "llama" or "qwen2"; it prefixes the model's hyperparameter keys.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.str("general.architecture")
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_description(),
    }
}

/// A cursor over the available prefix of a file of `file_len` bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    file_len: u64,
}

/// A tensor info as read, before its offset is resolved against the data section.
struct RawTensor<'a> {
    name: &'a str,
    dims: Vec<u64>,
    ty: TensorType,
    relative_offset: u64,
    size: u64,
}

impl<'a> Reader<'a> {
    fn parse_file(&mut self) -> Result<Gguf, GgufError> {
        let magic: [u8; 4] = self.array().map_err(|e| e.context(|| "the magic".into()))?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.u32().map_err(|e| e.context(|| "the version".into()))?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let tensor_count = self
            .count("tensor count", MIN_TENSOR_INFO_BYTES)
            .map_err(|e| e.context(|| "the header".into()))?;
        let kv_count = self
            .count("metadata entry count", MIN_KV_BYTES)
            .map_err(|e| e.context(|| "the header".into()))?;

        let mut metadata = Metadata::with_capacity(kv_count);
        for index in 0..kv_count {
            let (key, value) = self.key_value(index)?;
            metadata
                .insert(key.to_string(), value)
                .map_err(|(key, _)| GgufError::DuplicateKey { key })?;
        }
        let alignment = alignment_from(metadata.get(ALIGNMENT_KEY))?;

        let mut raw_tensors = Vec::with_capacity(tensor_count);
        let mut names = HashSet::with_capacity(tensor_count);
        for index in 0..tensor_count {
            let tensor = self.tensor_info(index)?;
            if !names.insert(tensor.name) {
                return Err(GgufError::DuplicateTensor {
                    tensor: tensor.name.to_string(),
                });
            }
            raw_tensors.push(tensor);
        }

        let data_offset = self
            .pos
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| GgufError::Truncated {
                context: "the padding before the tensor data".into(),
                offset: self.pos as u64,
                needed: alignment as u64,
                file_len: self.file_len,
            })?;
        let tensors = raw_tensors
            .into_iter()
            .map(|raw| self.place_tensor(raw, data_offset, alignment))
            .collect::<Result<Vec<_>, _>>()?;
        check_no_overlap(&tensors)?;
        Ok(Gguf {
            version,
            alignment,
            metadata,
            tensors,
            data_offset,
        })
    }

    fn key_value(&mut self, index: usize) -> Result<(&'a str, Value), GgufError> {
        let key = self
            .string()
            .map_err(|e| e.context(|| format!("the key of metadata entry #{index}")))?;
        let type_id = self
            .u32()
            .map_err(|e| e.context(|| format!("the type of metadata key '{key}'")))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            context: format!("metadata key '{key}'"),
            type_id,
        })?;
        let value = self
            .value(ty, key, 0)
            .map_err(|e| e.context(|| format!("the value of metadata key '{key}'")))?;
        Ok((key, value))
    }

    /// Reads one value of type `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>()?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
            // Strict: gguf-py writes 0 or 1, and anything else means the file is damaged.
            ValueType::Bool => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                byte => {
                    return Err(GgufError::InvalidBool {
                        key: key.to_string(),
                        byte,
                    })
                }
            },
            ValueType::String => Value::String(self.string()?.to_string()),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        key: key.to_string(),
                    });
                }
                let type_id = self.u32()?;
                let item_ty =
                    ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                        context: format!("the array elements of metadata key '{key}'"),
                        type_id,
                    })?;
                let len = self.count("array length", item_ty.min_encoded_len())?;
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    items.push(self.value(item_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }

    fn tensor_info(&mut self, index: usize) -> Result<RawTensor<'a>, GgufError> {
        let name = self
            .string()
            .map_err(|e| e.context(|| format!("the name of tensor #{index}")))?;
        let info_context = || format!("the info of tensor '{name}'");
        let n_dims = self.u32().map_err(|e| e.context(info_context))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                tensor: name.to_string(),
                n_dims,
            });
        }
        let dims = (0..n_dims)
            .map(|_| self.u64())
            .collect::<Result<Vec<_>, _>>();
        let dims = dims.map_err(|e| e.context(info_context))?;
        let type_id = self.u32().map_err(|e| e.context(info_context))?;
        let relative_offset = self.u64().map_err(|e| e.context(info_context))?;

        let (ty, size) = tensor_type_and_size(name, &dims, type_id)?;
        Ok(RawTensor {
            name,
            dims,
            ty,
            relative_offset,
            size,
        })
    }

    /// Resolves a tensor's offset and checks its data is aligned and inside the file.
    fn place_tensor(
        &self,
        raw: RawTensor<'_>,
        data_offset: usize,
        alignment: usize,
    ) -> Result<TensorInfo, GgufError> {
        let name = raw.name.to_string();
        if !raw.relative_offset.is_multiple_of(alignment as u64) {
            return Err(GgufError::MisalignedTensor {
                tensor: name,
                offset: raw.relative_offset,
                alignment,
            });
        }
        let start = (data_offset as u64).checked_add(raw.relative_offset);
        let end = start
            .and_then(|start| start.checked_add(raw.size))
            .filter(|&end| end <= self.file_len);
        let (Some(start), Some(end)) = (start, end) else {
            return Err(GgufError::TensorOutOfBounds {
                tensor: name,
                offset: (data_offset as u64).saturating_add(raw.relative_offset),
                size: raw.size,
                file_len: self.file_len,
            });
        };
        // `end` fits in usize whenever the whole file does; it may not when streaming a file
        // larger than the address space (a > 4 GiB model on wasm32).
        if usize::try_from(end).is_err() {
            return Err(GgufError::TooLargeForPlatform {
                tensor: name,
                bytes: end,
            });
        }
        Ok(TensorInfo {
            name,
            dims: raw.dims,
            ty: raw.ty,
            offset: start as usize,
            size: raw.size as usize,
        })
    }

    fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<usize, GgufError> {
        let offset = self.pos as u64;
        let count = self.u64()?;
        let remaining = self.remaining();
        if count > remaining / min_item_bytes {
            return Err(GgufError::LengthBeyondFile {
                context: String::new(),
                what,
                length: count,
                offset,
                remaining,
            });
        }
        // count <= remaining <= the prefix length or more; the bytes must still fit in memory.
        usize::try_from(count).map_err(|_| GgufError::LengthBeyondFile {
            context: String::new(),
            what,
            length: count,
            offset,
            remaining,
        })
    }

    // Invalid UTF-8 is an error rather than replaced: the GGUF spec requires UTF-8, gguf-py
    // writes strings from Python `str` (always valid), and lossy replacement could silently make
    // two distinct token strings equal.
    fn string(&mut self) -> Result<&'a str, GgufError> {
        let offset = self.pos as u64;
        let len = self.count("string length", 1)?;
        let bytes = self.take(len as u64)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            context: String::new(),
            offset,
        })
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn remaining(&self) -> u64 {
        self.file_len - self.pos as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let start = self.pos as u64;
        let end = match start.checked_add(n) {
            Some(end) if end <= self.file_len => end,
            _ => {
                return Err(GgufError::Truncated {
                    context: String::new(),
                    offset: start,
                    needed: n,
                    file_len: self.file_len,
                })
            }
        };
        if end > self.bytes.len() as u64 {
            return Err(GgufError::NeedMoreBytes {
                have: self.bytes.len(),
                needed: end,
            });
        }
        let slice = &self.bytes[self.pos..end as usize];
        self.pos = end as usize;
        Ok(slice)
    }
}

/// The alignment a file declares with the `general.alignment` value (if any).
pub(crate) fn alignment_from(value: Option<&Value>) -> Result<usize, GgufError> {
    match value {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(&Value::U32(alignment)) if alignment.is_power_of_two() => usize::try_from(alignment)
            .map_err(|_| GgufError::InvalidAlignment {
                alignment: alignment.into(),
            }),
        Some(&Value::U32(alignment)) => Err(GgufError::InvalidAlignment {
            alignment: alignment.into(),
        }),
        // llama.cpp reads it with gguf_get_val_u32 only, so any other type is a broken file.
        Some(other) => Err(wrong_type(ALIGNMENT_KEY, "u32", other)),
    }
}

/// Checks a tensor's shape against its type and returns the type and the data size in bytes;
/// shared with the writer so that it cannot produce what the parser rejects.
pub(crate) fn tensor_type_and_size(
    name: &str,
    dims: &[u64],
    type_id: u32,
) -> Result<(TensorType, u64), GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name.to_string(),
            n_dims: dims.len() as u32,
        });
    }
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            tensor: name.to_string(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || GgufError::ElementCountOverflow {
        tensor: name.to_string(),
        dims: dims.to_vec(),
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let ty = TensorType::from_ggml_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.to_string(),
        type_id,
    })?;
    let block_len = ty.block_len() as u64;
    if !dims[0].is_multiple_of(block_len) {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: name.to_string(),
            ty,
            row_len: dims[0],
        });
    }
    let size = (n_elements / block_len)
        .checked_mul(ty.block_bytes() as u64)
        .ok_or_else(overflow)?;
    // TensorInfo's accessors work in usize; the size is checked by the caller against the file.
    if usize::try_from(n_elements).is_err() {
        return Err(GgufError::TooLargeForPlatform {
            tensor: name.to_string(),
            bytes: size,
        });
    }
    Ok((ty, size))
}

fn check_no_overlap(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_unstable_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        let first_end = first.offset + first.size;
        if first_end > second.offset {
            return Err(GgufError::TensorsOverlap {
                first: first.name.clone(),
                second: second.name.clone(),
                first_end: first_end as u64,
                second_start: second.offset as u64,
            });
        }
    }
    Ok(())
}
