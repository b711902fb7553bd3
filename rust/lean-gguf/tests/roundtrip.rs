//! GgufWriter → Gguf::parse round trips, the writer's byte layout, the typed getters and the
//! writer's own validation.

mod common;

use common::{tensor_bytes, RawGguf, Rng};
use lean_gguf::{Gguf, GgufError, GgufWriter, TensorType, Value, ValueType};

/// One value of every type, extremes included, and arrays of every type.
fn every_value() -> Vec<(String, Value)> {
    let scalars = vec![
        Value::U8(0),
        Value::U8(u8::MAX),
        Value::I8(i8::MIN),
        Value::U16(u16::MAX),
        Value::I16(i16::MIN),
        Value::U32(u32::MAX),
        Value::I32(i32::MIN),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F32(-0.0),
        Value::F32(f32::MIN_POSITIVE / 2.0), // subnormal
        Value::F32(f32::INFINITY),
        Value::F64(std::f64::consts::PI),
        Value::F64(f64::NEG_INFINITY),
        Value::Bool(false),
        Value::Bool(true),
        Value::String(String::new()),
        Value::String("ünïcødé 🦀 \n\0 quotes\"".to_string()),
    ];
    let mut entries: Vec<(String, Value)> = scalars
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("scalar.{i}.{}", v.type_description()), v.clone()))
        .collect();
    // One array per scalar type, of all the scalars above of that type.
    for ty in ValueType::ALL
        .into_iter()
        .filter(|&ty| ty != ValueType::Array)
    {
        let items: Vec<Value> = scalars
            .iter()
            .filter(|v| v.value_type() == ty)
            .cloned()
            .collect();
        assert!(!items.is_empty(), "{ty:?} has a sample scalar");
        entries.push((format!("array.{}", ty.name()), Value::Array(items)));
    }
    entries.push(("array.u8.single".into(), Value::Array(vec![Value::U8(7)])));
    entries.push(("array.empty".into(), Value::Array(vec![])));
    entries.push((
        "array.nested".into(),
        Value::Array(vec![
            Value::Array(vec![Value::I32(-1), Value::I32(2)]),
            Value::Array(vec![Value::String("s".into())]),
            Value::Array(vec![Value::Array(vec![Value::F64(0.5)])]),
            Value::Array(vec![]),
        ]),
    ));
    entries
}

#[test]
fn every_value_type_round_trips_in_order() {
    let entries = every_value();
    let mut writer = GgufWriter::new();
    for (key, value) in &entries {
        writer.add(key.as_str(), value.clone());
    }
    let bytes = writer.finish().unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();

    assert_eq!(gguf.version, 3);
    assert_eq!(gguf.alignment, 32);
    assert!(gguf.tensors.is_empty());
    assert_eq!(gguf.metadata.len(), entries.len());
    for ((key, value), (parsed_key, parsed)) in entries.iter().zip(gguf.metadata.iter()) {
        assert_eq!(key, parsed_key);
        assert_eq!(value, parsed, "{key}");
        // PartialEq calls -0.0 == 0.0; the bits must survive too.
        match (value, parsed) {
            (Value::F32(a), Value::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{key}"),
            (Value::F64(a), Value::F64(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{key}"),
            _ => {}
        }
    }
    let covered: std::collections::HashSet<ValueType> =
        gguf.metadata.iter().map(|(_, v)| v.value_type()).collect();
    assert_eq!(
        covered.len(),
        ValueType::ALL.len(),
        "every value type is exercised"
    );
}

#[test]
fn every_tensor_type_round_trips_at_several_alignments() {
    let mut rng = Rng::new(1);
    for alignment in [1u32, 8, 32, 64, 4096] {
        let mut writer = GgufWriter::new();
        writer.add("general.architecture", "test");
        if alignment != 32 {
            writer.alignment(alignment);
        }
        let mut expected = Vec::new();
        for (i, ty) in TensorType::ALL.into_iter().enumerate() {
            // Odd shapes so that sizes are rarely multiples of the alignment.
            let dims = vec![ty.block_len() as u64 * 3, 1 + i as u64 % 3];
            let data = rng.bytes(tensor_bytes(ty, &dims));
            let name = format!("blk.{i}.{}", ty.name());
            writer.add_tensor(name.as_str(), ty, &dims, data.clone());
            expected.push((name, ty, dims, data));
        }
        let four_d = vec![32u64, 2, 3, 2];
        let four_d_data = rng.bytes(tensor_bytes(TensorType::Q5_1, &four_d));
        writer.add_tensor("four_d", TensorType::Q5_1, &four_d, four_d_data.clone());
        expected.push(("four_d".into(), TensorType::Q5_1, four_d, four_d_data));

        let bytes = writer.finish().unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        assert_eq!(gguf.alignment, alignment as usize);
        assert_eq!(gguf.data_offset % alignment as usize, 0);
        assert_eq!(gguf.tensors.len(), expected.len());
        for (info, (name, ty, dims, data)) in gguf.tensors.iter().zip(&expected) {
            assert_eq!((&info.name, info.ty, &info.dims), (name, *ty, dims));
            assert_eq!(
                (info.offset - gguf.data_offset) % alignment as usize,
                0,
                "{name} aligned"
            );
            assert_eq!(info.size, data.len());
            assert_eq!(gguf.tensor_data(&bytes, info), &data[..], "{name} data");
            assert_eq!(info.n_elements(), dims.iter().product::<u64>() as usize);
            assert_eq!(info.row_len(), dims[0] as usize);
            assert_eq!(info.rows(), dims[1..].iter().product::<u64>() as usize);
            assert_eq!(info.row_bytes(), ty.row_bytes(dims[0] as usize).unwrap());
            assert_eq!(gguf.tensor(name), Some(info));
        }
    }
}

#[test]
fn version_2_files_read_like_version_3() {
    let mut bytes = common::sample_file();
    let v3 = Gguf::parse(&bytes).unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let v2 = Gguf::parse(&bytes).unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(Gguf { version: 3, ..v2 }, v3);
}

/// The writer's bytes, checked against the format spelled out field by field.
#[test]
fn writer_layout_matches_the_format() {
    let data: Vec<u8> = (0..34).collect();
    let written = GgufWriter::new()
        .add("general.architecture", "llama")
        .add("ids", [1i32, -1])
        .add_tensor("t", TensorType::Q8_0, &[32], data.clone())
        .add_f32_tensor("v", &[2], &[1.0, -2.0])
        .finish()
        .unwrap();
    let mut raw = RawGguf::new(3, 2, 2);
    raw.kv("general.architecture", 8).string(b"llama");
    raw.kv("ids", 9).u32(5).u64(2).u32(1).u32(u32::MAX);
    raw.tensor_info("t", &[32], 8, 0);
    raw.tensor_info("v", &[2], 0, 64); // 34 bytes padded to 64
    raw.pad_to(32);
    raw.bytes.extend_from_slice(&data);
    raw.pad_to(32);
    raw.bytes.extend_from_slice(&1.0f32.to_le_bytes());
    raw.bytes.extend_from_slice(&(-2.0f32).to_le_bytes());
    raw.pad_to(32);
    assert_eq!(written, raw.finish());
}

#[test]
fn writer_alignment_replaces_an_added_value_and_is_written_as_u32() {
    let bytes = GgufWriter::new()
        .add("general.alignment", 64u32)
        .alignment(128)
        .finish()
        .unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    assert_eq!(gguf.alignment, 128);
    assert_eq!(gguf.metadata.len(), 1);
    assert_eq!(gguf.get("general.alignment"), Some(&Value::U32(128)));
}

fn getters_file() -> Gguf {
    let bytes = GgufWriter::new()
        .add("general.architecture", "qwen2")
        .add("u8", 7u8)
        .add("i64.small", 123_456i64)
        .add("i32.negative", -1i32)
        .add("u64.big", 1u64 << 40)
        .add("f64", 0.1f64)
        .add("f32", 1e-6f32)
        .add("flag", true)
        .add("tokens", ["a", "b"])
        .add("ids", [1u32, 2])
        .add("empty", Value::Array(vec![]))
        .finish()
        .unwrap();
    Gguf::parse(&bytes).unwrap()
}

#[test]
fn integer_getters_accept_any_integer_type_that_fits() {
    let gguf = getters_file();
    assert_eq!(gguf.u32("u8").unwrap(), 7);
    assert_eq!(gguf.u32("i64.small").unwrap(), 123_456);
    assert_eq!(gguf.u32_opt("absent").unwrap(), None);
    assert_eq!(
        gguf.u32("i32.negative").unwrap_err(),
        GgufError::ValueOutOfRange {
            key: "i32.negative".into(),
            value: "-1".into(),
            target: "u32"
        }
    );
    assert!(matches!(
        gguf.u32("u64.big"),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert_eq!(
        gguf.u32("f32").unwrap_err(),
        GgufError::WrongType {
            key: "f32".into(),
            expected: "an integer",
            found: "f32".into()
        }
    );
    assert_eq!(
        gguf.u32("absent").unwrap_err(),
        GgufError::MissingKey {
            key: "absent".into()
        }
    );
    assert_eq!(
        gguf.u32("absent").unwrap_err().to_string(),
        "metadata key 'absent' is missing"
    );
}

#[test]
fn other_getters_check_types() {
    let gguf = getters_file();
    assert_eq!(gguf.architecture().unwrap(), "qwen2");
    assert_eq!(gguf.f32("f32").unwrap(), 1e-6);
    assert_eq!(gguf.f32("f64").unwrap(), 0.1f64 as f32);
    assert_eq!(gguf.f32_opt("absent").unwrap(), None);
    assert!(matches!(gguf.f32("u8"), Err(GgufError::WrongType { .. })));
    assert_eq!(gguf.str_opt("absent").unwrap(), None);
    assert_eq!(
        gguf.str("flag").unwrap_err().to_string(),
        "metadata key 'flag': expected a string, found bool"
    );
    assert_eq!(gguf.bool_opt("flag").unwrap(), Some(true));
    assert_eq!(gguf.bool_opt("absent").unwrap(), None);
    assert!(matches!(
        gguf.bool_opt("u8"),
        Err(GgufError::WrongType { .. })
    ));
    assert_eq!(gguf.string_array("tokens").unwrap(), ["a", "b"]);
    assert!(gguf.string_array("empty").unwrap().is_empty());
    assert_eq!(
        gguf.string_array("ids").unwrap_err().to_string(),
        "metadata key 'ids': expected an array of strings, found array of u32"
    );
    assert_eq!(gguf.array("ids").unwrap(), [Value::U32(1), Value::U32(2)]);
    assert!(matches!(gguf.array("u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(
        gguf.array("absent"),
        Err(GgufError::MissingKey { .. })
    ));
    assert_eq!(
        gguf.require_tensor("x").unwrap_err(),
        GgufError::MissingTensor { tensor: "x".into() }
    );
}

#[test]
fn value_display_abbreviates_long_arrays() {
    assert_eq!(Value::from("a\"b").to_string(), "\"a\\\"b\"");
    assert_eq!(Value::from([1u8, 2, 3]).to_string(), "[1, 2, 3]");
    assert_eq!(
        Value::from((0..10u32).collect::<Vec<_>>()).to_string(),
        "[0, 1, 2, 3, 4, 5, 6, 7, ... (10 items)]"
    );
}

#[test]
fn writer_rejects_what_the_parser_would() {
    let err = |writer: &mut GgufWriter| writer.finish().unwrap_err();
    assert_eq!(
        err(GgufWriter::new().add("k", 1u8).add("k", 2u8)),
        GgufError::DuplicateKey { key: "k".into() }
    );
    assert_eq!(
        err(GgufWriter::new().add("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)]))),
        GgufError::MixedArray {
            key: "mixed".into(),
            first: "u8",
            other: "i8"
        }
    );
    assert!(matches!(
        err(GgufWriter::new().add(
            "deep",
            Value::Array(vec![Value::Array(vec![Value::U8(1), Value::U16(1)])])
        )),
        GgufError::MixedArray {
            first: "u8",
            other: "u16",
            ..
        }
    ));
    assert_eq!(
        err(GgufWriter::new().alignment(48)),
        GgufError::InvalidAlignment { alignment: 48 }
    );
    assert_eq!(
        err(GgufWriter::new().add_tensor("t", TensorType::F32, &[4], vec![0u8; 15])),
        GgufError::TensorDataSize {
            tensor: "t".into(),
            expected: 16,
            actual: 15
        }
    );
    assert_eq!(
        err(GgufWriter::new()
            .add_f32_tensor("t", &[1], &[0.0])
            .add_f32_tensor("t", &[1], &[0.0])),
        GgufError::DuplicateTensor { tensor: "t".into() }
    );
    assert!(matches!(
        err(GgufWriter::new().add_tensor("t", TensorType::Q4_0, &[16], vec![])),
        GgufError::RowNotBlockMultiple { row_len: 16, .. }
    ));
    assert!(matches!(
        err(GgufWriter::new().add_tensor("t", TensorType::F32, &[1, 1, 1, 1, 1], vec![0; 4])),
        GgufError::BadDimCount { n_dims: 5, .. }
    ));
    assert!(matches!(
        err(GgufWriter::new().add_tensor("t", TensorType::F32, &[], vec![])),
        GgufError::BadDimCount { n_dims: 0, .. }
    ));
    assert!(matches!(
        err(GgufWriter::new().add_tensor("t", TensorType::F32, &[4, 0], vec![])),
        GgufError::ZeroDim { .. }
    ));
}
