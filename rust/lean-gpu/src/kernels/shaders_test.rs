//! Every shader variant, assembled exactly as pipeline creation assembles it, parsed and
//! validated by naga (the WGSL front end and validator wgpu runs) without an adapter: every
//! tensor type × skeleton, both matvec reductions (subgroups without the browser's directive,
//! as natively), each attention head size, and each set of override constants a pipeline is
//! made with (resolved per entry point, as pipeline creation resolves them). Each params
//! struct's size is checked against its WGSL struct's, from naga's layouter.
use super::wgsl::Variant;
use naga::valid::{ValidationFlags, Validator};

fn every_variant() -> Vec<Variant> {
    [
        super::matvec::variants(),
        super::matmul::variants(),
        super::embed::variants(),
        super::norm::variants(),
        super::rope_kv_store::variants(),
        super::attention::variants(),
        super::gated::variants(),
        super::argmax::variants(),
        super::argmax_masked::variants(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The module and its info, or a panic with naga's report.
fn validate(v: &Variant) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(&v.source)
        .unwrap_or_else(|e| panic!("{}: {}", v.label, e.emit_to_string(&v.source)));
    // What wgpu allows a WebGPU-compliant device without features (core WGSL), with subgroups
    // for the matvec that reduces with them.
    let features = match v.source.contains("subgroupAdd") {
        true => wgpu::Features::SUBGROUP,
        false => wgpu::Features::empty(),
    };
    let capabilities = wgpu_naga_bridge::features_to_naga_capabilities(
        features,
        wgpu::DownlevelFlags::compliant(),
    );
    let info = Validator::new(ValidationFlags::all(), capabilities)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", v.label, e.emit_to_string(&v.source)));
    (module, info)
}

#[test]
fn every_shader_variant_validates_with_naga() {
    let variants = every_variant();
    let mut pipelines = 0;
    for v in &variants {
        let (module, info) = validate(v);
        for entry in &v.entry_points {
            assert!(
                module.entry_points.iter().any(|e| e.name == *entry),
                "{}: no entry point {entry}",
                v.label
            );
            for constants in &v.pipelines {
                let constants: naga::back::PipelineConstants =
                    constants.iter().map(|&(k, x)| (k.to_string(), x)).collect();
                let stage = Some((naga::ShaderStage::Compute, *entry));
                if let Err(e) = naga::back::pipeline_constants::process_overrides(
                    &module, &info, stage, &constants,
                ) {
                    panic!("{} {entry} with {constants:?}: {e}", v.label);
                }
                pipelines += 1;
            }
        }
    }
    // 7 types: matvec (2 reductions), matmul, embed; attention 3 + 3 + 2; the rest
    assert_eq!(variants.len(), 7 * 4 + 1 + 2 + 1 + 8 + 1 + 1 + 1);
    eprintln!(
        "{} modules, {pipelines} pipelines validated",
        variants.len()
    );
}

#[test]
fn params_structs_are_as_large_as_their_wgsl_structs() {
    for v in every_variant() {
        let (module, _) = validate(&v);
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");
        let uniforms: Vec<_> = module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::Uniform)
            .collect();
        assert_eq!(
            uniforms.len(),
            v.uniforms.len(),
            "{}: uniform bindings",
            v.label
        );
        for &(binding, size) in &v.uniforms {
            let (_, var) = uniforms
                .iter()
                .find(|(_, g)| g.binding == Some(naga::ResourceBinding { group: 0, binding }))
                .unwrap_or_else(|| panic!("{}: no uniform at binding {binding}", v.label));
            assert_eq!(
                layouter[var.ty].size as usize,
                size,
                "{}: the Rust value at binding {binding} ({}) and the WGSL struct differ in size",
                v.label,
                var.name.as_deref().unwrap_or("?")
            );
        }
    }
}
