//! Weight matrices on the device. A matrix larger than one storage binding is split by rows into
//! parts, each its own buffer and dispatch.
//!
//! The decode matvec reads every weight once per token, so the types that carry real models'
//! weights (Q4_0, Q8_0, Q6_K) and F32 are repacked once at upload into planes of aligned words:
//! one word of quants per 8-element slice of a row, so that neighbouring threads, which take
//! neighbouring slices, load neighbouring words (instead of shifting pairs of words out of 18-,
//! 34- or 210-byte blocks), with scales in planes of their own. The other types stay exactly as
//! in the GGUF file. A repacked part has the byte count of the file's rows (padded to 16).
//!
//! Q4_0, Q8_0 and Q6_K interleave their planes by row quads (`packs_row_quads`): a matvec thread dots
//! its slice with 4 consecutive rows (matvec.wgsl's ROWS_PER_THREAD), and finds the 4 rows'
//! words of that slice, and their 4 scales, side by side: one 16-byte load per plane instead
//! of four. Their parts are padded with zero rows to whole quads.
//! Each type's WGSL snippet (shaders/quant_<type>.wgsl) reads the layout written here.
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use lean_gguf::TensorType;

/// Elements of a unit: a block of the 32-element types, a sub-block of the K-quants (units.wgsl).
const UNIT_LEN: usize = 32;
/// Elements of a slice, the part of a row one matvec thread dots per step (units.wgsl).
const SLICE_LEN: usize = 8;

/// Rows whose words a row-quad plane keeps side by side (matvec.wgsl: ROWS_PER_THREAD).
pub(crate) const ROW_QUAD: usize = 4;

/// Whether `ty`'s planes are interleaved by row quads (see the module comment; the WGSL
/// snippet then defines the matvec's quad_dot itself).
pub(crate) fn packs_row_quads(ty: TensorType) -> bool {
    matches!(ty, TensorType::Q4_0 | TensorType::Q8_0 | TensorType::Q6_K)
}

/// Rows a part of `rows` rows of `ty` holds on the device: whole quads where it packs them.
fn device_rows(ty: TensorType, rows: usize) -> usize {
    if packs_row_quads(ty) {
        rows.next_multiple_of(ROW_QUAD)
    } else {
        rows
    }
}

/// Index of item `i` of row `row` (`per_row` items a row) in a plane interleaved by row quads:
/// the quad's rows' items i side by side (quant_q4_0.wgsl and quant_q8_0.wgsl: quad_at).
fn quad_at(row: usize, i: usize, per_row: usize) -> usize {
    ((row / ROW_QUAD) * per_row + i) * ROW_QUAD + row % ROW_QUAD
}

/// Where a part's arrays lie, as the WGSL snippets see it (units.wgsl: `Layout`).
#[repr(C)]
#[derive(Copy, Clone, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Layout {
    /// Units per row.
    units: u32,
    /// Bytes per row of a type kept as in the file.
    row_bytes: u32,
    /// Word offsets of a repacked type's arrays after the first (scales and such).
    regions: [u32; 3],
    pad: [u32; 3],
}

/// Rows `first_row .. first_row + rows` of a matrix, in their own buffer (in the layout of the
/// matrix's type, see the module comment).
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

/// Bytes of one row on the device (`row_bytes`: in the file).
fn device_row_bytes(ty: TensorType, cols: usize, row_bytes: usize) -> usize {
    match ty {
        // rows padded with zeros to whole units
        TensorType::F32 => cols.next_multiple_of(UNIT_LEN) * 4,
        _ => row_bytes,
    }
}

/// Bytes of a part of `rows` rows on the device, padded to 16 (shaders read 16-byte words).
fn part_bytes(ty: TensorType, rows: usize, cols: usize, row_bytes: usize) -> usize {
    (device_rows(ty, rows) * device_row_bytes(ty, cols, row_bytes))
        .next_multiple_of(16)
        .max(16)
}

/// The layout of a part of `rows` rows (`part_bytes` bounds every offset, and upload_split keeps
/// parts below 4 GiB).
fn layout(ty: TensorType, rows: usize, cols: usize, row_bytes: usize) -> Layout {
    let units_per_row = cols.div_ceil(UNIT_LEN);
    // Slices of the whole part: the planes after the first start after a word for each.
    let slices = device_rows(ty, rows) * units_per_row * (UNIT_LEN / SLICE_LEN);
    let regions = match ty {
        // f16 scales of the units
        TensorType::Q4_0 => [slices, 0, 0],
        // the second words of the slices, then the f16 scales of the units
        TensorType::Q8_0 => [slices, 2 * slices, 0],
        // high bit pairs (a word per 2 slices), i8 scales (a byte per 2), f16 d (per 32)
        TensorType::Q6_K => [
            slices,
            slices + slices / 2,
            slices + slices / 2 + slices / 8,
        ],
        _ => [0; 3],
    };
    Layout {
        units: units_per_row as u32,
        row_bytes: row_bytes as u32,
        regions: regions.map(|r| r as u32),
        pad: [0; 3],
    }
}

/// The device bytes of `data` (whole rows of `ty` as in the file) in the layout of the type.
fn pack_part(ty: TensorType, cols: usize, data: &[u8]) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols).expect("checked at upload");
    let rows = data.len() / row_bytes;
    let mut out = vec![0u8; part_bytes(ty, rows, cols, row_bytes)];
    let units = cols.div_ceil(UNIT_LEN);
    let row_slices = units * (UNIT_LEN / SLICE_LEN);
    let slices = device_rows(ty, rows) * row_slices;
    // Block b's row, and the word index of its slice c (0..4) and of its scale, in quad planes.
    let slice_word = |b: usize, c: usize| quad_at(b / units, 4 * (b % units) + c, row_slices);
    let scale_at = |b: usize| quad_at(b / units, b % units, units);
    match ty {
        TensorType::F32 => {
            let stride = cols.next_multiple_of(UNIT_LEN) * 4;
            for (src, dst) in data
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(stride))
            {
                dst[..row_bytes].copy_from_slice(src);
            }
        }
        // Q4_0 blocks: f16 d, qs[16] with element e < 16 in the low nibble of qs[e], 16 + e in
        // the high one. Row quads: a word per slice, then the f16 scales.
        TensorType::Q4_0 => {
            let (quants, scales) = out.split_at_mut(4 * slices);
            for (b, block) in data.chunks_exact(18).enumerate() {
                let q = |e: usize| (block[2 + e % 16] >> (4 * (e / 16))) & 0x0F;
                for (c, word) in nibble_slices(q).iter().enumerate() {
                    let at = 4 * slice_word(b, c);
                    quants[at..at + 4].copy_from_slice(word);
                }
                let at = 2 * scale_at(b);
                scales[at..at + 2].copy_from_slice(&block[..2]);
            }
        }
        // Q8_0 blocks: f16 d, i8 qs[32]; bytes q + 128 (the shader turns bytes into floats
        // without sign extension). Row quads: words of elements 0..4 of each slice, then of
        // 4..8, then the f16 scales.
        TensorType::Q8_0 => {
            let (first, rest) = out.split_at_mut(4 * slices);
            let (second, scales) = rest.split_at_mut(4 * slices);
            for (b, block) in data.chunks_exact(34).enumerate() {
                for (c, q) in block[2..].chunks_exact(SLICE_LEN).enumerate() {
                    let at = 4 * slice_word(b, c);
                    for j in 0..4 {
                        first[at + j] = q[j] ^ 0x80;
                        second[at + j] = q[4 + j] ^ 0x80;
                    }
                }
                let at = 2 * scale_at(b);
                scales[at..at + 2].copy_from_slice(&block[..2]);
            }
        }
        TensorType::Q6_K => pack_q6_k(data, cols, slices, &mut out),
        _ => out[..data.len()].copy_from_slice(data),
    }
    out
}

/// 4-bit values `q(e)` of one unit (32 elements) as the unit's 4 slice words: byte j of slice
/// c holds element 8c + j in its low nibble and 8c + 4 + j in its high one.
fn nibble_slices(q: impl Fn(usize) -> u8) -> [[u8; 4]; 4] {
    std::array::from_fn(|c| std::array::from_fn(|j| q(8 * c + j) | (q(8 * c + 4 + j) << 4)))
}

/// Q6_K blocks (ql[128], qh[64], i8 scales[16], f16 d; 6-bit q = low | high << 4, weight =
/// d * scale[e / 16] * (q - 32)) as four planes, each interleaved by row quads (quad_at):
/// - low nibbles, a word per slice as Q4_0's (nibble_slices);
/// - high bit pairs, a word per two slices: byte j holds at bits 2f field f = the pairs of
///   elements j, 4 + j of the even slice, then of the odd one (shifting right by 4 for the odd
///   slice, the shader moves each field next to its nibbles with one shift and mask);
/// - the scales, one byte per two slices (16 elements), as scale + 128 (the shader reads
///   bytes as floats without sign extension): a word per 8 slices;
/// - one f16 d per block.
fn pack_q6_k(data: &[u8], cols: usize, slices: usize, out: &mut [u8]) {
    let (low, rest) = out.split_at_mut(4 * slices);
    let (high, rest) = rest.split_at_mut(2 * slices);
    let (scales, d) = rest.split_at_mut(slices / 2);
    let blocks = cols / 256;
    let row_slices = cols / SLICE_LEN;
    let mut q = [0u8; 256];
    for (b, block) in data.chunks_exact(210).enumerate() {
        let (row, first_slice) = (b / blocks, 32 * (b % blocks));
        let word = |i: usize, per_row: usize| 4 * quad_at(row, i, per_row);
        let (ql, qh) = (&block[..128], &block[128..192]);
        for (e, q) in q.iter_mut().enumerate() {
            let (h, i) = (e / 128, e % 128);
            let low = (ql[64 * h + i % 64] >> (4 * (i / 64))) & 0x0F;
            let high = (qh[32 * h + i % 32] >> (2 * (i / 32))) & 0x03;
            *q = low | (high << 4);
        }
        for (u, q) in q.chunks_exact(UNIT_LEN).enumerate() {
            let unit_slice = first_slice + 4 * u;
            for (c, bytes) in nibble_slices(|e| q[e] & 0x0F).iter().enumerate() {
                let at = word(unit_slice + c, row_slices);
                low[at..at + 4].copy_from_slice(bytes);
            }
            // two words of pairs: slices 0, 1 and 2, 3 of the unit
            for pair in 0..2 {
                let at = word(unit_slice / 2 + pair, row_slices / 2);
                for j in 0..4 {
                    let field = |f: usize| {
                        let slice = 2 * pair + f / 2;
                        (q[8 * slice + 4 * (f % 2) + j] >> 4) << (2 * f)
                    };
                    high[at + j] = field(0) | field(1) | field(2) | field(3);
                }
            }
        }
        for (k, &scale) in block[192..208].iter().enumerate() {
            scales[word(first_slice / 8 + k / 4, row_slices / 8) + k % 4] = scale ^ 0x80;
        }
        let at = 2 * quad_at(row, b % blocks, blocks);
        d[at..at + 2].copy_from_slice(&block[208..210]);
    }
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
        // Offsets in the shaders are u32 (bytes, for the types kept as in the file).
        let limit = max_part_bytes.min(u32::MAX as u64) as usize;
        // The most rows whose part, padded by up to 15 bytes, fits the limit.
        let fit = limit.saturating_sub(15) / device_row_bytes(ty, cols, row_bytes);
        // Parts of whole row quads where they can be: a SwiGLU matvec needs whole pairs, and a
        // row-quad type's padding to a whole quad must fit too.
        let rows_per_part = if device_rows(ty, rows) <= fit {
            rows
        } else if fit >= ROW_QUAD {
            fit - fit % ROW_QUAD
        } else if packs_row_quads(ty) {
            0
        } else if fit > 1 {
            fit & !1
        } else {
            fit
        };
        if rows_per_part == 0 {
            let n = if packs_row_quads(ty) {
                "4 rows"
            } else {
                "one row"
            };
            return Err(GpuError::TooLarge(format!(
                "{n} of {ty} ({row_bytes} bytes each) exceed the binding limit of \
                 {max_part_bytes} bytes"
            )));
        }
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|first_row| {
                let n = rows_per_part.min(rows - first_row);
                let bytes = &data[first_row * row_bytes..(first_row + n) * row_bytes];
                WeightPart {
                    buffer: ctx.upload_bytes(&format!("{ty} weights"), &pack_part(ty, cols, bytes)),
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

    /// Bytes per row in the GGUF file.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn parts(&self) -> &[WeightPart] {
        &self.parts
    }

    /// 8-element slices per row (F32 rows are padded to whole 32-element units).
    pub(crate) fn slices(&self) -> usize {
        self.cols.div_ceil(UNIT_LEN) * (UNIT_LEN / SLICE_LEN)
    }

    /// Where the arrays of `part` (one of `parts()`) lie in its buffer.
    pub(crate) fn layout(&self, part: &WeightPart) -> Layout {
        layout(self.ty, part.rows, self.cols, self.row_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repacked types keep the file's byte count (of whole row quads where they pack
    /// them), padded to 16.
    #[test]
    fn repacking_keeps_the_size() {
        for (ty, cols) in [
            (TensorType::Q4_0, 64),
            (TensorType::Q8_0, 96),
            (TensorType::Q6_K, 512),
            (TensorType::Q4_K, 256),
        ] {
            let row_bytes = ty.row_bytes(cols).unwrap();
            for rows in [1, 3, 8] {
                let data = vec![0u8; rows * row_bytes];
                let packed = pack_part(ty, cols, &data);
                let stored = if packs_row_quads(ty) {
                    rows.next_multiple_of(4)
                } else {
                    rows
                };
                assert_eq!(packed.len(), (stored * row_bytes).next_multiple_of(16));
                assert_eq!(packed.len(), part_bytes(ty, rows, cols, row_bytes));
                // quad_f16 and the planes' 16-byte loads need planes at multiples of 4 words
                if packs_row_quads(ty) {
                    let regions = layout(ty, rows, cols, row_bytes).regions;
                    assert!(regions.iter().all(|r| r % 4 == 0), "{ty}: {regions:?}");
                }
            }
        }
        assert_eq!(part_bytes(TensorType::F32, 3, 33, 132), 3 * 64 * 4);
    }

    /// Every Q4_0 and Q8_0 quant and scale of a part whose rows are not whole quads lands
    /// where quant_q4_0.wgsl and quant_q8_0.wgsl look for it (quad_at), and the padding rows
    /// are zeros.
    #[test]
    fn row_quads_hold_every_element() {
        let (rows, cols) = (6, 64);
        for ty in [TensorType::Q4_0, TensorType::Q8_0] {
            let row_bytes = ty.row_bytes(cols).unwrap();
            let data: Vec<u8> = (0..rows * row_bytes)
                .map(|i| (i as u8).wrapping_mul(29).wrapping_add(3) & 0x3F)
                .collect();
            let packed = pack_part(ty, cols, &data);
            let layout = layout(ty, rows, cols, row_bytes);
            let word = |w: usize| u32::from_le_bytes(packed[4 * w..][..4].try_into().unwrap());
            let half = |h: usize| half::f16::from_le_bytes([packed[2 * h], packed[2 * h + 1]]);
            let (units, row_slices) = (cols / 32, cols / 8);
            let scales = if ty == TensorType::Q4_0 { 0 } else { 1 };
            for row in 0..8 {
                let mut want = vec![0f32; cols];
                if row < rows {
                    let bytes = &data[row * row_bytes..][..row_bytes];
                    lean_quant::scalar::dequantize(ty, bytes, &mut want);
                }
                for (e, &want) in want.iter().enumerate() {
                    let (s, j) = (e / 8, e % 8);
                    let at = quad_at(row, s, row_slices);
                    let region = 2 * layout.regions[scales] as usize;
                    let d = half(region + quad_at(row, e / 32, units)).to_f32();
                    let q = if ty == TensorType::Q4_0 {
                        ((word(at) >> (8 * (j % 4) + 4 * (j / 4))) & 0xF) as f32 - 8.0
                    } else {
                        let plane = if j < 4 { 0 } else { layout.regions[0] as usize };
                        ((word(plane + at) >> (8 * (j % 4))) & 0xFF) as f32 - 128.0
                    };
                    if row < rows {
                        assert_eq!(d * q, want, "{ty} row {row} element {e}");
                    } else {
                        assert_eq!(d, 0.0, "{ty} padding row {row}");
                    }
                }
            }
        }
    }

    /// Every Q6_K quant, scale and d of a part whose rows are not whole quads lands where
    /// quant_q6_k.wgsl looks for it.
    #[test]
    fn q6_k_slices_hold_every_element() {
        let (rows, cols) = (5, 512);
        let data: Vec<u8> = (0..rows * 420)
            .map(|i| (i as u8).wrapping_mul(37).wrapping_add(11))
            .collect();
        let packed = pack_part(TensorType::Q6_K, cols, &data);
        let layout = layout(TensorType::Q6_K, rows, cols, 420);
        let word = |w: usize| u32::from_le_bytes(packed[4 * w..][..4].try_into().unwrap());
        let regions = layout.regions.map(|r| r as usize);
        let row_slices = cols / 8;
        for row in 0..rows {
            let mut want = vec![0f32; cols];
            lean_quant::scalar::dequantize(TensorType::Q6_K, &data[row * 420..][..420], &mut want);
            for (e, &want) in want.iter().enumerate() {
                let (s, j) = (e / 8, (e % 8) as u32);
                let nibble =
                    (word(quad_at(row, s, row_slices)) >> (8 * (j % 4) + 4 * (j / 4))) & 0xF;
                let field = 4 * (s as u32 & 1) + 2 * (j / 4);
                let pairs = word(regions[0] + quad_at(row, s / 2, row_slices / 2));
                let pair = (pairs >> (8 * (j % 4) + field)) & 3;
                let scales = word(regions[1] + quad_at(row, s / 8, row_slices / 8));
                let scale = ((scales >> (8 * ((s / 2) % 4))) & 0xFF) as f32 - 128.0;
                let h = 4 * regions[2] + 2 * quad_at(row, e / 256, cols / 256);
                let d = half::f16::from_le_bytes([packed[h], packed[h + 1]]).to_f32();
                let q = (nibble | (pair << 4)) as f32 - 32.0;
                assert_eq!(d * scale * q, want, "row {row} element {e}");
            }
        }
    }
}
