//! Every malformed-file case gets its own error variant; truncation and random mutation never
//! panic.

mod common;

use common::{sample_file, RawGguf, Rng};
use lean_gguf::{Gguf, GgufError, MAX_ARRAY_DEPTH};

const F32: u32 = 0;
const Q4_0: u32 = 2;
const ARRAY: u32 = 9;

fn parse_err(bytes: &[u8]) -> GgufError {
    Gguf::parse(bytes).expect_err("the file is malformed")
}

/// A file with only the given tensor infos (type, dims, relative offset) and `data_len` zero
/// bytes of data after the padding.
fn with_tensors(infos: &[(&str, &[u64], u32, u64)], data_len: usize) -> Vec<u8> {
    let mut raw = RawGguf::new(3, infos.len() as u64, 0);
    for &(name, dims, type_id, offset) in infos {
        raw.tensor_info(name, dims, type_id, offset);
    }
    raw.pad_to(32).zeros(data_len).finish()
}

#[test]
fn the_raw_helper_builds_valid_files() {
    let gguf = Gguf::parse(&with_tensors(
        &[("a", &[8], F32, 0), ("b", &[32, 2], Q4_0, 32)],
        32 + 36,
    ))
    .unwrap();
    assert_eq!(gguf.tensors[1].offset, gguf.data_offset + 32);
    assert_eq!(gguf.tensors[1].size, 36);
}

#[test]
fn bad_magic() {
    let mut bytes = sample_file();
    bytes[..4].copy_from_slice(b"GGML");
    let err = parse_err(&bytes);
    assert_eq!(err, GgufError::BadMagic { found: *b"GGML" });
    assert_eq!(
        err.to_string(),
        "not a GGUF file: magic is \"GGML\", expected \"GGUF\""
    );
}

#[test]
fn unsupported_versions() {
    for version in [0, 1, 4, 0x0300_0000] {
        let mut bytes = sample_file();
        bytes[4..8].copy_from_slice(&u32::to_le_bytes(version));
        assert_eq!(parse_err(&bytes), GgufError::UnsupportedVersion { version });
    }
    let big_endian = GgufError::UnsupportedVersion {
        version: 0x0300_0000,
    };
    assert!(
        big_endian.to_string().contains("big-endian"),
        "{big_endian}"
    );
}

#[test]
fn truncation_names_the_offset() {
    let bytes = sample_file();
    assert_eq!(
        parse_err(&bytes[..6]),
        GgufError::Truncated {
            context: "the version".into(),
            offset: 4,
            needed: 4,
            file_len: 6
        }
    );
    assert_eq!(
        parse_err(&bytes[..2]).to_string(),
        "GGUF file truncated while reading the magic: needs 4 bytes at offset 0, but the file is 2 bytes"
    );
}

#[test]
fn every_prefix_of_a_valid_file_is_an_error() {
    let bytes = sample_file();
    for len in 0..bytes.len() {
        match Gguf::parse(&bytes[..len]) {
            Err(
                GgufError::Truncated { .. }
                | GgufError::LengthBeyondFile { .. }
                | GgufError::TensorOutOfBounds { .. },
            ) => {}
            other => panic!("prefix of {len} bytes: {other:?}"),
        }
    }
}

#[test]
fn header_prefixes_ask_for_more_bytes_until_the_header_is_complete() {
    let bytes = sample_file();
    let full = Gguf::parse(&bytes).unwrap();
    let file_len = bytes.len() as u64;
    let header_len = (0..bytes.len())
        .find(|&len| Gguf::parse_header(&bytes[..len], file_len).is_ok())
        .unwrap();
    assert!(header_len <= full.data_offset && header_len > full.data_offset - 32);
    for len in 0..header_len {
        match Gguf::parse_header(&bytes[..len], file_len) {
            Err(GgufError::NeedMoreBytes { have, needed }) => {
                assert_eq!(have, len);
                assert!(
                    needed > len as u64 && needed <= header_len as u64,
                    "prefix {len}: needs {needed}"
                );
            }
            other => panic!("prefix of {len} bytes: {other:?}"),
        }
    }
    for len in header_len..=bytes.len() {
        assert_eq!(Gguf::parse_header(&bytes[..len], file_len).unwrap(), full);
    }
    // A loader that fetches exactly what is asked for gets there.
    let mut have = 0;
    let mut fetches = 0;
    let streamed = loop {
        match Gguf::parse_header(&bytes[..have], file_len) {
            Ok(gguf) => break gguf,
            Err(GgufError::NeedMoreBytes { needed, .. }) => have = needed as usize,
            Err(e) => panic!("{e}"),
        }
        fetches += 1;
    };
    assert_eq!(streamed, full);
    assert!(fetches > 10, "the sample header has many fields: {fetches}");
    // A prefix longer than file_len is cut to it.
    assert_eq!(
        Gguf::parse_header(&bytes, 6).unwrap_err(),
        parse_err(&bytes[..6])
    );
}

#[test]
fn header_tensor_bounds_use_the_file_length() {
    let bytes = sample_file();
    let header_only = &bytes[..Gguf::parse(&bytes).unwrap().data_offset];
    assert!(matches!(
        Gguf::parse_header(header_only, bytes.len() as u64 - 1),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

#[test]
fn counts_beyond_the_file() {
    let err = parse_err(&RawGguf::new(3, u64::MAX, 0).finish());
    assert!(
        matches!(
            err,
            GgufError::LengthBeyondFile {
                what: "tensor count",
                length: u64::MAX,
                offset: 8,
                ..
            }
        ),
        "{err:?}"
    );
    let err = parse_err(&RawGguf::new(3, 0, 1 << 40).finish());
    assert!(
        matches!(
            err,
            GgufError::LengthBeyondFile {
                what: "metadata entry count",
                ..
            }
        ),
        "{err:?}"
    );

    // The key length is larger than the rest of the file.
    let mut raw = RawGguf::new(3, 0, 1);
    raw.u64(1000).zeros(20);
    let err = parse_err(&raw.finish());
    assert_eq!(
        err,
        GgufError::LengthBeyondFile {
            context: "the key of metadata entry #0".into(),
            what: "string length",
            length: 1000,
            offset: 24,
            remaining: 20
        }
    );
    assert_eq!(
        err.to_string(),
        "string length 1000 of the key of metadata entry #0 (at offset 24) cannot fit in the 20 bytes left in the file"
    );

    // Three u64s announced, two present.
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("a", ARRAY).u32(10).u64(3).u64(1).u64(2);
    let err = parse_err(&raw.finish());
    assert!(
        matches!(&err, GgufError::LengthBeyondFile { what: "array length", length: 3, remaining: 16, context, .. } if context.contains("'a'")),
        "{err:?}"
    );

    // Enough bytes for the announced strings' length fields, but not for their contents.
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("s", ARRAY)
        .u32(8)
        .u64(2)
        .string(b"abcdefgh")
        .u64(9)
        .zeros(8);
    assert!(matches!(
        parse_err(&raw.finish()),
        GgufError::LengthBeyondFile {
            what: "string length",
            length: 9,
            ..
        }
    ));

    // A huge array of u8 is refused before anything is allocated for it.
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("big", ARRAY).u32(0).u64(u64::MAX / 2);
    assert!(matches!(
        parse_err(&raw.finish()),
        GgufError::LengthBeyondFile {
            what: "array length",
            ..
        }
    ));
}

#[test]
fn unknown_value_types() {
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("weird", 13).u32(0);
    let err = parse_err(&raw.finish());
    assert_eq!(
        err,
        GgufError::UnknownValueType {
            context: "metadata key 'weird'".into(),
            type_id: 13
        }
    );
    assert_eq!(
        err.to_string(),
        "unknown GGUF metadata value type 13 in metadata key 'weird'"
    );

    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("arr", ARRAY).u32(99).u64(0);
    assert_eq!(
        parse_err(&raw.finish()),
        GgufError::UnknownValueType {
            context: "the array elements of metadata key 'arr'".into(),
            type_id: 99
        }
    );
}

/// `levels` arrays nested in each other, the innermost an empty u32 array.
fn nested_arrays(levels: usize) -> Vec<u8> {
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("deep", ARRAY);
    for _ in 1..levels {
        raw.u32(ARRAY).u64(1);
    }
    raw.u32(4).u64(0).finish()
}

#[test]
fn nested_arrays_up_to_the_depth_limit() {
    let gguf = Gguf::parse(&nested_arrays(MAX_ARRAY_DEPTH)).unwrap();
    let mut value = gguf.get("deep").unwrap();
    for _ in 1..MAX_ARRAY_DEPTH {
        value = &value.as_array().unwrap()[0];
    }
    assert_eq!(value.as_array(), Some(&[][..]));
    assert_eq!(
        parse_err(&nested_arrays(MAX_ARRAY_DEPTH + 1)),
        GgufError::ArrayTooDeep { key: "deep".into() }
    );
    // Deep enough to overflow the stack if the depth were not bounded.
    assert_eq!(
        parse_err(&nested_arrays(1_000_000)),
        GgufError::ArrayTooDeep { key: "deep".into() }
    );
}

#[test]
fn invalid_utf8_names_the_key_or_tensor() {
    let mut raw = RawGguf::new(3, 0, 1);
    raw.string(b"bad\xff").u32(4).u32(0);
    assert_eq!(
        parse_err(&raw.finish()),
        GgufError::InvalidUtf8 {
            context: "the key of metadata entry #0".into(),
            offset: 24
        }
    );

    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("name", 8).string(b"\xc3");
    let err = parse_err(&raw.finish());
    assert_eq!(
        err.to_string(),
        "the value of metadata key 'name' (at offset 40) is not valid UTF-8"
    );

    let mut raw = RawGguf::new(3, 1, 0);
    raw.tensor_info("w\u{e9}", &[8], F32, 0);
    let mut bytes = raw.pad_to(32).zeros(32).finish();
    let at = bytes.iter().position(|&b| b == 0xc3).unwrap();
    bytes[at + 1] = b'x';
    assert_eq!(
        parse_err(&bytes),
        GgufError::InvalidUtf8 {
            context: "the name of tensor #0".into(),
            offset: 24
        }
    );
}

#[test]
fn bools_must_be_0_or_1() {
    let mut raw = RawGguf::new(3, 0, 1);
    raw.kv("flag", 7).u8(2);
    assert_eq!(
        parse_err(&raw.finish()),
        GgufError::InvalidBool {
            key: "flag".into(),
            byte: 2
        }
    );
}

#[test]
fn duplicate_keys() {
    let mut raw = RawGguf::new(3, 0, 2);
    raw.kv_u32("k", 1).kv_u32("k", 2);
    assert_eq!(
        parse_err(&raw.finish()),
        GgufError::DuplicateKey { key: "k".into() }
    );
}

fn with_alignment(write_value: impl FnOnce(&mut RawGguf)) -> Vec<u8> {
    let mut raw = RawGguf::new(3, 0, 1);
    raw.string(b"general.alignment");
    write_value(&mut raw);
    raw.finish()
}

#[test]
fn alignment_must_be_a_power_of_two_u32() {
    assert_eq!(
        parse_err(&with_alignment(|r| {
            r.u32(4).u32(0);
        })),
        GgufError::InvalidAlignment { alignment: 0 }
    );
    assert_eq!(
        parse_err(&with_alignment(|r| {
            r.u32(4).u32(48);
        })),
        GgufError::InvalidAlignment { alignment: 48 }
    );
    assert_eq!(
        parse_err(&with_alignment(|r| {
            r.u32(10).u64(32);
        })),
        GgufError::WrongType {
            key: "general.alignment".into(),
            expected: "u32",
            found: "u64".into()
        }
    );
    let gguf = Gguf::parse(&with_alignment(|r| {
        r.u32(4).u32(1 << 31);
    }))
    .unwrap();
    assert_eq!(gguf.alignment, 1 << 31);
    assert_eq!(
        gguf.data_offset,
        1 << 31,
        "the header is padded even though the file ends"
    );
}

#[test]
fn tensor_offsets_must_be_aligned_to_the_declared_alignment() {
    let mut raw = RawGguf::new(3, 1, 1);
    raw.kv_u32("general.alignment", 64)
        .tensor_info("w", &[8], F32, 32);
    let bytes = raw.pad_to(64).zeros(64).finish();
    assert_eq!(
        parse_err(&bytes),
        GgufError::MisalignedTensor {
            tensor: "w".into(),
            offset: 32,
            alignment: 64
        }
    );
    let err = parse_err(&with_tensors(&[("w", &[8], F32, 16)], 64));
    assert_eq!(
        err.to_string(),
        "tensor 'w': data offset 16 is not a multiple of the alignment 32"
    );
}

#[test]
fn dimension_counts() {
    for n_dims in [0u32, 5] {
        let mut raw = RawGguf::new(3, 1, 0);
        raw.string(b"w").u32(n_dims);
        raw.zeros(64);
        assert_eq!(
            parse_err(&raw.finish()),
            GgufError::BadDimCount {
                tensor: "w".into(),
                n_dims
            }
        );
    }
}

#[test]
fn zero_dims_are_rejected() {
    assert_eq!(
        parse_err(&with_tensors(&[("empty", &[8, 0], F32, 0)], 32)),
        GgufError::ZeroDim {
            tensor: "empty".into(),
            dims: vec![8, 0]
        }
    );
}

#[test]
fn element_count_and_size_overflow() {
    let dims = [1u64 << 32, 1 << 32];
    assert_eq!(
        parse_err(&with_tensors(&[("huge", &dims, F32, 0)], 32)),
        GgufError::ElementCountOverflow {
            tensor: "huge".into(),
            dims: dims.to_vec()
        }
    );
    // 2^62 elements fit in u64, their 2^64 bytes do not.
    assert!(matches!(
        parse_err(&with_tensors(&[("huge", &[1 << 62], F32, 0)], 32)),
        GgufError::ElementCountOverflow { .. }
    ));
    // Representable in 64 bits, but larger than the file or than 32-bit usize.
    let err = parse_err(&with_tensors(&[("big", &[1 << 40, 4], F32, 0)], 32));
    if cfg!(target_pointer_width = "64") {
        assert!(
            matches!(
                err,
                GgufError::TensorOutOfBounds {
                    size: 0x1000_0000_0000,
                    ..
                }
            ),
            "{err:?}"
        );
    } else {
        assert_eq!(
            err,
            GgufError::TooLargeForPlatform {
                tensor: "big".into(),
                bytes: 0x1000_0000_0000
            }
        );
    }
}

/// Streaming the header of an 8 GiB file whose second tensor starts at 4 GiB: fine where
/// usize is 64 bits, a clear error on wasm32.
#[test]
fn streamed_files_beyond_the_address_space() {
    let bytes = with_tensors(&[("low", &[8], F32, 0), ("high", &[8], F32, 1 << 32)], 0);
    let result = Gguf::parse_header(&bytes, 1 << 33);
    if cfg!(target_pointer_width = "64") {
        let gguf = result.unwrap();
        assert_eq!(
            gguf.tensors[1].offset as u64,
            gguf.data_offset as u64 + (1 << 32)
        );
    } else {
        let data_offset = bytes.len() as u64;
        assert_eq!(
            result.unwrap_err(),
            GgufError::TooLargeForPlatform {
                tensor: "high".into(),
                bytes: data_offset + (1 << 32) + 32
            }
        );
    }
}

#[test]
fn rows_must_be_whole_blocks() {
    let err = parse_err(&with_tensors(&[("q", &[48, 2], Q4_0, 0)], 64));
    assert!(
        matches!(err, GgufError::RowNotBlockMultiple { row_len: 48, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "tensor 'q': row length 48 is not a multiple of Q4_0's block length 32"
    );
}

#[test]
fn unknown_tensor_types_name_the_tensor_and_id() {
    // 4 was Q4_2 (removed from ggml), 39 is beyond anything lean reads.
    for type_id in [4u32, 39, u32::MAX] {
        let err = parse_err(&with_tensors(&[("blk.0.w", &[32], type_id, 0)], 256));
        assert_eq!(
            err,
            GgufError::UnknownTensorType {
                tensor: "blk.0.w".into(),
                type_id
            }
        );
        assert_eq!(
            err.to_string(),
            format!("tensor 'blk.0.w' has unknown or unsupported ggml type id {type_id}")
        );
    }
}

#[test]
fn duplicate_tensor_names() {
    assert_eq!(
        parse_err(&with_tensors(
            &[("a", &[8], F32, 0), ("a", &[8], F32, 32)],
            64
        )),
        GgufError::DuplicateTensor { tensor: "a".into() }
    );
}

#[test]
fn tensor_data_must_lie_inside_the_file() {
    let bytes = with_tensors(&[("a", &[8], F32, 0), ("b", &[8], F32, 32)], 63);
    let data_offset = Gguf::parse_header(&bytes, bytes.len() as u64 + 1)
        .unwrap()
        .data_offset as u64;
    assert_eq!(
        parse_err(&bytes),
        GgufError::TensorOutOfBounds {
            tensor: "b".into(),
            offset: data_offset + 32,
            size: 32,
            file_len: bytes.len() as u64
        }
    );
    // An offset so large that offset + size overflows.
    let err = parse_err(&with_tensors(&[("far", &[8], F32, u64::MAX - 31)], 32));
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { size: 32, .. }),
        "{err:?}"
    );
}

#[test]
fn tensors_must_not_overlap() {
    let err = parse_err(&with_tensors(
        &[("b", &[8], F32, 32), ("a", &[16], F32, 0)],
        64,
    ));
    let GgufError::TensorsOverlap {
        first,
        second,
        first_end,
        second_start,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (first.as_str(), second.as_str(), first_end - second_start),
        ("a", "b", 32)
    );
    // Out of file order but disjoint is fine.
    Gguf::parse(&with_tensors(
        &[("b", &[8], F32, 64), ("a", &[16], F32, 0)],
        96,
    ))
    .unwrap();
}

/// Whatever parses must honour the invariants callers rely on.
fn check_invariants(gguf: &Gguf, file_len: usize) {
    for t in &gguf.tensors {
        assert!(t.offset + t.size <= file_len);
        assert_eq!((t.offset - gguf.data_offset) % gguf.alignment, 0);
        assert_eq!(t.size, t.rows() * t.ty.row_bytes(t.row_len()).unwrap());
    }
}

fn parse_without_panicking(bytes: &[u8], what: &str) {
    match std::panic::catch_unwind(|| Gguf::parse(bytes)) {
        Ok(Ok(gguf)) => check_invariants(&gguf, bytes.len()),
        Ok(Err(err)) => assert!(!err.to_string().is_empty()),
        Err(_) => panic!("parse panicked on {what}"),
    }
}

#[test]
fn every_single_bit_flip_is_handled() {
    let original = sample_file();
    let mut bytes = original.clone();
    for pos in 0..bytes.len() {
        for bit in 0..8 {
            bytes[pos] ^= 1 << bit;
            parse_without_panicking(&bytes, &format!("bit {bit} of byte {pos} flipped"));
            bytes[pos] = original[pos];
        }
    }
}

#[test]
fn random_byte_mutations_are_handled() {
    let original = sample_file();
    let mut rng = Rng::new(0x5eed);
    let mut accepted = 0;
    for round in 0..5000 {
        let mut bytes = original.clone();
        // Mostly one byte; sometimes a few, to reach states one change cannot.
        let changes = if round % 4 == 0 { 1 + rng.below(4) } else { 1 };
        let mut what = format!("round {round}:");
        for _ in 0..changes {
            let pos = rng.below(bytes.len());
            bytes[pos] = rng.next_u64() as u8;
            what += &format!(" byte {pos} = {:#04x}", bytes[pos]);
        }
        parse_without_panicking(&bytes, &what);
        accepted += Gguf::parse(&bytes).is_ok() as usize;
    }
    eprintln!("{accepted} of 5000 mutated files parsed");
    // Data bytes (and some metadata values) can change freely; header damage must be caught.
    assert!(
        (500..4500).contains(&accepted),
        "{accepted} of 5000 mutated files parsed"
    );
}
