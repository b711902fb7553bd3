// F32: one element per block.
const BLOCK_LEN: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;
const PARTS: u32 = 1u;

fn part_dot(blk: u32, part: u32, xi: u32) -> f32 {
    return bitcast<f32>(w[blk >> 2u]) * x[xi];
}

// Element e of the block at byte blk (the prefill matmul dequantizes tiles with this).
fn weight_at(blk: u32, e: u32) -> f32 {
    return bitcast<f32>(w[blk >> 2u]);
}
