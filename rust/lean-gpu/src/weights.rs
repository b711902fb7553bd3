//! Weight matrices on the device, packed exactly as in the GGUF file. A matrix larger than one
//! storage binding is split by rows into parts, each its own buffer and dispatch.
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use lean_gguf::TensorType;

/// Rows `first_row .. first_row + rows` of a matrix, in their own buffer.
pub struct WeightPart {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub rows: usize,
}

pub struct GpuMatrix {
    ty: TensorType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    parts: Vec<WeightPart>,
}

impl GpuMatrix {
    /// Uploads a `rows × cols` matrix of type `ty` (`data`: exactly its bytes), split to fit
    /// the device's binding limit.
    pub fn upload(
        ctx: &GpuContext,
        ty: TensorType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Self> {
        Self::upload_split(ctx, ty, rows, cols, data, ctx.max_binding_bytes())
    }

    /// As `upload`, with parts of at most `max_part_bytes` (tests force small limits).
    pub fn upload_split(
        ctx: &GpuContext,
        ty: TensorType,
        rows: usize,
        cols: usize,
        data: &[u8],
        max_part_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or_else(|| GpuError::Shape(format!("{cols} columns are not whole {ty} blocks")))?;
        if rows == 0 || cols == 0 || rows.checked_mul(row_bytes) != Some(data.len()) {
            return Err(GpuError::Shape(format!(
                "{} bytes are not a {rows} x {cols} {ty} matrix",
                data.len()
            )));
        }
        // Whole u32 words per part: a part's size rounds up to a multiple of 4.
        let rows_per_part =
            (max_part_bytes.saturating_sub(3) / row_bytes as u64).min(rows as u64) as usize;
        if rows_per_part == 0 {
            return Err(GpuError::TooLarge(format!("one {ty} row of {row_bytes} bytes exceeds the binding limit of {max_part_bytes} bytes")));
        }
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|first_row| {
                let n = rows_per_part.min(rows - first_row);
                let bytes = &data[first_row * row_bytes..(first_row + n) * row_bytes];
                WeightPart {
                    buffer: ctx.upload_bytes(&format!("{ty} weights"), bytes),
                    first_row,
                    rows: n,
                }
            })
            .collect();
        Ok(GpuMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            parts,
        })
    }

    pub fn ty(&self) -> TensorType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn parts(&self) -> &[WeightPart] {
        &self.parts
    }
}
