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

/// Whether a stack of the tensors `names` (a whole run, stacking order) goes to the device with
/// its rows interleaved: gate|up as [gate_0, up_0, gate_1, up_1, ...], so that the rows a
/// decode matvec workgroup owns are whole (gate row, up row) pairs and it writes silu(gate) · up
/// itself (SwiGLU fused in: the down projection reads the activation, not [gate | up]).
pub(crate) fn interleaves(names: &[&str]) -> bool {
    matches!(names, [gate, up] if gate.ends_with(".ffn_gate.weight") && up.ends_with(".ffn_up.weight"))
}

/// The bytes of matrices stacked by rows: a 2-D tensor's data is row-major, so the members'
/// bytes one after another are the stacked matrix's; with `interleave`, members of equal size
/// alternate row by row instead, `interleave` bytes a row (see `interleaves`).
pub(crate) fn stacked_bytes(members: &[&[u8]], interleave: Option<usize>) -> Vec<u8> {
    match interleave {
        Some(row_bytes) if row_bytes > 0 && members.iter().all(|m| m.len() == members[0].len()) => {
            let mut out = Vec::with_capacity(members.len() * members[0].len());
            for i in 0..members[0].len() / row_bytes {
                for m in members {
                    out.extend_from_slice(&m[i * row_bytes..(i + 1) * row_bytes]);
                }
            }
            out
        }
        _ => members.concat(),
    }
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
    fn gate_and_up_rows_interleave() {
        assert!(interleaves(&[
            "blk.0.ffn_gate.weight",
            "blk.0.ffn_up.weight"
        ]));
        assert!(!interleaves(&[
            "blk.0.ffn_up.weight",
            "blk.0.ffn_gate.weight"
        ]));
        assert!(!interleaves(&[
            "blk.0.attn_q.weight",
            "blk.0.attn_k.weight"
        ]));
        let (gate, up) = ([1u8, 2, 3, 4, 5, 6], [7u8, 8, 9, 10, 11, 12]);
        let both = [&gate[..], &up[..]];
        assert_eq!(
            stacked_bytes(&both, Some(2)),
            [1, 2, 7, 8, 3, 4, 9, 10, 5, 6, 11, 12]
        );
        assert_eq!(
            stacked_bytes(&both, None),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
        );
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
