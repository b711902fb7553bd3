//! Builds GGUF v3 files in memory: for tests and for synthetic (random-weight) models.

use crate::parse::{alignment_from, tensor_type_and_size};
use crate::value::{Value, ValueType};
use crate::{GgufError, TensorType, ALIGNMENT_KEY};
use std::collections::HashSet;

/// Collects metadata and tensors, then [`GgufWriter::finish`] validates them and lays out the
/// file the way gguf-py does (metadata and tensors in the order added, each tensor's data
/// padded to the alignment).
///
/// ```
/// use lean_gguf::{Gguf, GgufWriter, TensorType};
/// let bytes = GgufWriter::new()
///     .add("general.architecture", "llama")
///     .add("llama.block_count", 2u32)
///     .add("tokenizer.ggml.tokens", ["<s>", "hi"])
///     .add_f32_tensor("output_norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0])
///     .add_tensor("token_embd.weight", TensorType::Q8_0, &[32, 2], vec![0u8; 2 * 34])
///     .finish()
///     .unwrap();
/// let gguf = Gguf::parse(&bytes).unwrap();
/// assert_eq!(gguf.u32("llama.block_count").unwrap(), 2);
/// assert_eq!(gguf.tensor("token_embd.weight").unwrap().size, 68);
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: TensorType,
    dims: Vec<u64>,
    /// `None`: written in place by [`GgufWriter::finish_with`]'s `fill`.
    data: Option<Vec<u8>>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry: any `Value`, or a Rust scalar, `&str`/`String`, `Vec`, slice or
    /// array of those (arrays must hold one type; an empty array is written as an array of u8).
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Sets `general.alignment` (default 32); it must be a power of two.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        match self
            .metadata
            .iter_mut()
            .find(|(key, _)| key == ALIGNMENT_KEY)
        {
            Some((_, value)) => *value = Value::U32(alignment),
            None => self
                .metadata
                .push((ALIGNMENT_KEY.to_string(), Value::U32(alignment))),
        }
        self
    }

    /// Adds a tensor; `dims` in GGML order (`dims[0]` is the row length) and `data` exactly
    /// the type's encoding of that shape (checked by `finish`).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        dims: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
            data: Some(data.into()),
        });
        self
    }

    /// Adds a tensor whose bytes [`GgufWriter::finish_with`] writes straight into the file's
    /// buffer, so that large data (a multi-GB synthetic model) is never held twice. With plain
    /// [`GgufWriter::finish`] its bytes are zeros.
    pub fn add_tensor_in_place(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        dims: &[u64],
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
            data: None,
        });
        self
    }

    /// Adds an F32 tensor from its values.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        values: &[f32],
    ) -> &mut Self {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, TensorType::F32, dims, data)
    }

    /// Validates everything added (the same rules [`crate::Gguf::parse`] enforces, plus that
    /// each tensor's data has the right length) and returns the file's bytes.
    pub fn finish(&self) -> Result<Vec<u8>, GgufError> {
        self.finish_with(|_, _| {})
    }

    /// Like [`GgufWriter::finish`], then calls `fill(index, data)` for every tensor added with
    /// [`GgufWriter::add_tensor_in_place`]: `index` is its position in the order tensors were
    /// added (the parsed file's `tensors` order), `data` its zeroed bytes in the file.
    pub fn finish_with(
        &self,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<Vec<u8>, GgufError> {
        let mut keys = HashSet::with_capacity(self.metadata.len());
        for (key, value) in &self.metadata {
            if !keys.insert(key.as_str()) {
                return Err(GgufError::DuplicateKey { key: key.clone() });
            }
            check_homogeneous(key, value)?;
        }
        let alignment = alignment_from(
            self.metadata
                .iter()
                .find(|(k, _)| k == ALIGNMENT_KEY)
                .map(|(_, v)| v),
        )?;

        let mut names = HashSet::with_capacity(self.tensors.len());
        // (offset relative to the data section, size) of each tensor.
        let mut ranges = Vec::with_capacity(self.tensors.len());
        let mut data_len = 0usize;
        for tensor in &self.tensors {
            if !names.insert(tensor.name.as_str()) {
                return Err(GgufError::DuplicateTensor {
                    tensor: tensor.name.clone(),
                });
            }
            let (_, expected) =
                tensor_type_and_size(&tensor.name, &tensor.dims, tensor.ty.ggml_id())?;
            if let Some(data) = &tensor.data {
                if expected != data.len() as u64 {
                    return Err(GgufError::TensorDataSize {
                        tensor: tensor.name.clone(),
                        expected,
                        actual: data.len(),
                    });
                }
            }
            // wasm32 addresses 4 GiB: the whole file must fit in one buffer.
            let too_large = || GgufError::TooLargeForPlatform {
                tensor: tensor.name.clone(),
                bytes: expected,
            };
            let size = usize::try_from(expected).map_err(|_| too_large())?;
            ranges.push((data_len, size));
            data_len = size
                .checked_next_multiple_of(alignment)
                .and_then(|padded| data_len.checked_add(padded))
                .ok_or_else(too_large)?;
        }

        let mut header = Vec::new();
        header.extend_from_slice(b"GGUF");
        header.extend_from_slice(&3u32.to_le_bytes());
        put_u64(&mut header, self.tensors.len() as u64);
        put_u64(&mut header, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut header, key);
            header.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut header, value);
        }
        for (tensor, (offset, _)) in self.tensors.iter().zip(&ranges) {
            put_str(&mut header, &tensor.name);
            header.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
            for &dim in &tensor.dims {
                put_u64(&mut header, dim);
            }
            header.extend_from_slice(&tensor.ty.ggml_id().to_le_bytes());
            put_u64(&mut header, *offset as u64);
        }
        let data_start = header.len().next_multiple_of(alignment);
        let total =
            data_start
                .checked_add(data_len)
                .ok_or_else(|| GgufError::TooLargeForPlatform {
                    tensor: self
                        .tensors
                        .last()
                        .map_or(String::new(), |t| t.name.clone()),
                    bytes: data_len as u64,
                })?;
        // A zeroed allocation: the OS hands out zero pages lazily, so the padding costs nothing
        // and in-place tensors are touched once, by `fill`.
        let mut out = vec![0u8; total];
        out[..header.len()].copy_from_slice(&header);
        for (index, (tensor, &(offset, size))) in self.tensors.iter().zip(&ranges).enumerate() {
            let dst = &mut out[data_start + offset..data_start + offset + size];
            match &tensor.data {
                Some(data) => dst.copy_from_slice(data),
                None => fill(index, dst),
            }
        }
        Ok(out)
    }
}

fn check_homogeneous(key: &str, value: &Value) -> Result<(), GgufError> {
    let Value::Array(items) = value else {
        return Ok(());
    };
    if let Some(first) = items.first() {
        let first_type = first.value_type();
        for item in items {
            if item.value_type() != first_type {
                return Err(GgufError::MixedArray {
                    key: key.to_string(),
                    first: first_type.name(),
                    other: item.value_type().name(),
                });
            }
            check_homogeneous(key, item)?;
        }
    }
    Ok(())
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let item_type = items.first().map_or(ValueType::U8, Value::value_type);
            out.extend_from_slice(&item_type.id().to_le_bytes());
            put_u64(out, items.len() as u64);
            for item in items {
                put_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gguf;

    #[test]
    fn in_place_tensors_are_filled_where_the_parser_finds_them() {
        let mut writer = GgufWriter::new();
        writer
            .add("general.architecture", "llama")
            .add_tensor_in_place("a", TensorType::Q8_0, &[32, 3])
            .add_f32_tensor("b", &[3], &[1.0, 2.0, 3.0])
            .add_tensor_in_place("c", TensorType::F32, &[5]);
        let mut calls = Vec::new();
        let bytes = writer
            .finish_with(|index, data| {
                calls.push((index, data.len()));
                assert!(data.iter().all(|&b| b == 0), "handed zeroed bytes");
                data.fill(index as u8 + 1);
            })
            .unwrap();
        assert_eq!(calls, [(0, 3 * 34), (2, 20)]);
        let gguf = Gguf::parse(&bytes).unwrap();
        let data = |name| gguf.tensor_data(&bytes, gguf.tensor(name).unwrap());
        assert_eq!(data("a"), [1u8; 102]);
        assert_eq!(data("b"), [1f32, 2.0, 3.0].map(f32::to_le_bytes).concat());
        assert_eq!(data("c"), [3u8; 20]);
        // Padding between tensors stays zero.
        let a = gguf.tensor("a").unwrap();
        assert!(bytes[a.offset + a.size..gguf.tensor("b").unwrap().offset]
            .iter()
            .all(|&b| b == 0));
        // Without a fill they are zeros, and the layout is the same.
        let zeros = writer.finish().unwrap();
        assert_eq!(zeros.len(), bytes.len());
        let parsed = Gguf::parse(&zeros).unwrap();
        assert_eq!(parsed.tensors, gguf.tensors);
        assert!(parsed
            .tensor_data(&zeros, parsed.tensor("a").unwrap())
            .iter()
            .all(|&b| b == 0));
    }

    #[test]
    fn in_place_tensor_shape_is_still_checked() {
        let err = GgufWriter::new()
            .add_tensor_in_place("w", TensorType::Q4_0, &[31, 2])
            .finish_with(|_, _| panic!("not filled when invalid"))
            .unwrap_err();
        assert!(
            matches!(err, GgufError::RowNotBlockMultiple { .. }),
            "{err}"
        );
    }
}
