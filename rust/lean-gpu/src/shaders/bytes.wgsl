// Byte access into weights kept as in the GGUF file, held as array<u32> (little-endian). Blocks
// of 22 bytes (Q5_0) start at any even byte offset, so fields are read with word loads + shifts.
// Every f16 field sits at an even offset, hence inside a single word.

fn load_u8(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xFFu;
}

// The little-endian u32 at any byte offset: one word, or the halves of two neighbours.
fn load_u32(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

// The f16 at an even byte offset, widened to f32 exactly.
fn load_f16(b: u32) -> f32 {
    let word = w[b >> 2u] >> ((b & 2u) * 8u);
    return unpack2x16float(word & 0xFFFFu).x;
}
