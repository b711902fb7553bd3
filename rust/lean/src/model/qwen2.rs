//! `qwen2` (Qwen2, Qwen2.5): the llama block plus biases on the q, k and v projections; rotary
//! embedding in HF's rotate_half layout (the converter does not permute qwen2's rows).
use super::weights::{Loader, Weights};
use crate::error::Result;

pub(crate) fn load(l: &Loader) -> Result<Weights> {
    let layers = (0..l.config.n_layers)
        .map(|i| l.layer(i, true))
        .collect::<Result<Vec<_>>>()?;
    l.weights(layers)
}
