//! Which weight matrices go to the device stacked: the matrices of a layer that read the same
//! input (q, k, v; gate, up) become one matrix of their rows stacked when they share a type and
//! a row length, so that one dispatch computes them all (decode is bound by the number of
//! dependent dispatches). Both loaders (`GpuSession::load` from a whole file, `StreamedModel`
//! from a download) group with `runs` here.
use lean_gguf::TensorType;
use std::ops::Range;

/// The stacks of a layer, by name after "blk.N." (as lean's loader names the tensors of every
/// architecture), members in the order their rows stack: the session's activation rows are
/// [q | k | v] and [gate | up].
pub(crate) const LAYER_STACKS: [&[&str]; 2] = [
    &["attn_q.weight", "attn_k.weight", "attn_v.weight"],
    &["ffn_gate.weight", "ffn_up.weight"],
];

/// The runs of a stack's members, given as (type, row length) in stacking order, that go to
/// the device as one matrix each: neighbours of one type and row length (a matrix has one of
/// each; Q4_K_M files give some layers' attn_v another type than attn_q's). Each run writes its
/// rows at its offset in the same activation rows.
pub(crate) fn runs(members: &[(TensorType, usize)]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, shape) in members.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if members[run.start] == *shape => run.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// The bytes of matrices stacked by rows: a 2-D tensor's data is row-major, so the members'
/// bytes one after another are the stacked matrix's.
pub(crate) fn stacked_bytes(members: &[&[u8]]) -> Vec<u8> {
    members.concat()
}

/// The layer and stack of a tensor name of a stack member: ("blk.3.attn_k.weight") → (3,
/// stack 0, member 1).
pub(crate) fn member_of(name: &str) -> Option<(usize, usize, usize)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    LAYER_STACKS
        .iter()
        .enumerate()
        .find_map(|(stack, members)| {
            let member = members.iter().position(|m| *m == suffix)?;
            Some((layer, stack, member))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_found_by_name() {
        assert_eq!(member_of("blk.0.attn_q.weight"), Some((0, 0, 0)));
        assert_eq!(member_of("blk.12.attn_v.weight"), Some((12, 0, 2)));
        assert_eq!(member_of("blk.3.ffn_up.weight"), Some((3, 1, 1)));
        assert_eq!(member_of("blk.3.ffn_down.weight"), None);
        assert_eq!(member_of("blk.3.attn_q.bias"), None);
        assert_eq!(member_of("blk.x.attn_q.weight"), None);
        assert_eq!(member_of("token_embd.weight"), None);
    }

    #[test]
    fn neighbours_of_one_type_and_row_length_stack() {
        let (q5, q8) = (TensorType::Q5_0, TensorType::Q8_0);
        assert_eq!(runs(&[(q5, 896), (q5, 896), (q5, 896)]), vec![0..3]);
        assert_eq!(runs(&[(q5, 896), (q5, 896), (q8, 896)]), [0..2, 2..3]);
        assert_eq!(runs(&[(q5, 896), (q8, 896), (q5, 896)]), [0..1, 1..2, 2..3]);
        assert_eq!(runs(&[(q5, 896), (q5, 128)]), [0..1, 1..2]);
        assert_eq!(runs(&[(q8, 64)]), vec![0..1]);
    }
}
