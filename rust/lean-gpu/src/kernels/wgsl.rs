//! Shader sources: the WGSL files, and how a module's source is assembled from them with the
//! constants it takes from Rust (see the module doc of `kernels`: one header of `const`s per
//! shader variant, generated here, never a copy in the WGSL file).
use lean_gguf::TensorType;
use std::fmt::Write;

/// Byte loads of weights kept as in the GGUF file (the block snippets read them).
pub(super) const BYTES: &str = include_str!("../shaders/bytes.wgsl");
/// The weight parts' Layout and helpers shared by every block snippet.
pub(super) const UNITS: &str = include_str!("../shaders/units.wgsl");
/// The gated activations (SiLU, GELU-tanh), for the shaders that apply one.
pub(super) const ACTIVATION: &str = include_str!("../shaders/activation.wgsl");

/// The tensor types with matvec, matmul and embed kernels, and their block decoders.
pub(super) const BLOCK_TYPES: [(TensorType, &str); 7] = [
    (TensorType::F32, include_str!("../shaders/quant_f32.wgsl")),
    (TensorType::Q4_0, include_str!("../shaders/quant_q4_0.wgsl")),
    (TensorType::Q4_1, include_str!("../shaders/quant_q4_1.wgsl")),
    (TensorType::Q5_0, include_str!("../shaders/quant_q5_0.wgsl")),
    (TensorType::Q8_0, include_str!("../shaders/quant_q8_0.wgsl")),
    (TensorType::Q4_K, include_str!("../shaders/quant_q4_k.wgsl")),
    (TensorType::Q6_K, include_str!("../shaders/quant_q6_k.wgsl")),
];

/// Browsers' WGSL wants subgroups enabled in the shader; naga (native) has no such directive.
pub(super) const SUBGROUPS_DIRECTIVE: &str = if cfg!(target_arch = "wasm32") {
    "enable subgroups;\n"
} else {
    ""
};

/// The header of WGSL `const` declarations a shader takes from Rust values.
#[derive(Clone, Debug, Default)]
pub(super) struct Consts(String);

impl Consts {
    pub(super) fn new() -> Self {
        Consts::default()
    }

    /// `const name: u32 = value;` (constants are small: a value past u32 is a bug here).
    pub(super) fn u32(mut self, name: &str, value: usize) -> Self {
        let value = u32::try_from(value).expect("a WGSL u32 constant");
        writeln!(self.0, "const {name}: u32 = {value}u;").expect("writing to a String");
        self
    }
}

/// A module's source: `directives` (which WGSL wants first), the header of `consts`, then
/// `parts` in order.
pub(super) fn assemble(directives: &str, consts: &Consts, parts: &[&str]) -> String {
    let mut source = format!(
        "{directives}// constants from lean-gpu's Rust code\n{}",
        consts.0
    );
    for part in parts {
        source.push('\n');
        source.push_str(part);
    }
    source
}

/// One shader module as pipeline creation assembles it, and what its pipelines are made with:
/// for the tests that validate every variant without a device (shaders_test.rs).
#[cfg(test)]
pub(super) struct Variant {
    pub label: String,
    pub source: String,
    /// The entry points pipelines are made of.
    pub entry_points: Vec<&'static str>,
    /// The override values of each pipeline made from the module (one empty set: none).
    pub pipelines: Vec<Vec<(&'static str, f64)>>,
    /// (binding, size of the Rust value written to it) of each uniform binding.
    pub uniforms: Vec<(u32, usize)>,
}

#[cfg(test)]
impl Variant {
    /// A module with entry point `main`, one pipeline without overrides and the params
    /// uniform `P` at binding 0.
    pub fn main<P>(label: impl Into<String>, source: String) -> Self {
        Variant {
            label: label.into(),
            source,
            entry_points: vec!["main"],
            pipelines: vec![vec![]],
            uniforms: vec![(0, std::mem::size_of::<P>())],
        }
    }

    /// Plus the step buffer at `binding`.
    pub fn with_step(mut self, binding: u32) -> Self {
        self.uniforms
            .push((binding, std::mem::size_of::<super::StepValues>()));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consts_are_u32_declarations_after_the_directives() {
        let consts = Consts::new().u32("A", 3).u32("B_C", 4096);
        let source = assemble("enable subgroups;\n", &consts, &["fn f() {}"]);
        assert!(source.starts_with("enable subgroups;\n"));
        assert!(source.contains("const A: u32 = 3u;\nconst B_C: u32 = 4096u;\n"));
        assert!(source.ends_with("\nfn f() {}"));
    }
}
