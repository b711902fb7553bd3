//! Seed inputs of the fuzz targets: tiny but valid models of each architecture (with a
//! byte-level BPE or a SentencePiece vocabulary and a chat template in their metadata), a tiny
//! tokenizer.json, and real chat templates. `make-seeds` writes them into `fuzz/corpus/`; the
//! replay test runs them directly too, so a seed that stops loading is noticed.
use lean_gguf::{GgufWriter, TensorType, Value};

/// ChatML, as SmolLM2 and Qwen2.5 write it.
pub const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Templates that reach minijinja's limits: loops, recursion, macros, namespaces, filters.
const TEMPLATES: [(&str, &str); 4] = [
    ("loops", "{% for i in range(1000) %}{% for m in messages %}{{ m.content|upper }}{% endfor %}{% endfor %}"),
    ("macro", "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(50) }}{{ messages|length }}"),
    ("namespace", "{% set ns = namespace(s='a') %}{% for m in messages %}{% set ns.s = ns.s ~ m.role %}{% endfor %}{{ ns.s|reverse|join(',') }}{{ bos_token }}{{ raise_exception('stop') if messages|length > 9 }}"),
    ("strftime", "{{ strftime_now('%d %b %Y') }}{{ messages[0]['content'][1:3] }}{{ (messages|last).content|tojson }}"),
];

/// The 256 byte symbols of byte-level BPE, in byte order.
fn byte_symbols() -> Vec<String> {
    lean_tokenizer::byte_level_alphabet()
        .iter()
        .map(|c| c.to_string())
        .collect()
}

/// A byte-level BPE tokenizer.json: the 256 byte symbols, one merge ("he"), one special token.
pub fn tokenizer_json() -> String {
    let mut vocab: serde_json::Map<String, serde_json::Value> = byte_symbols()
        .into_iter()
        .enumerate()
        .map(|(id, symbol)| (symbol, id.into()))
        .collect();
    vocab.insert("he".into(), 256.into());
    let byte_level = |add_prefix_space: bool| {
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": true, "use_regex": true})
    };
    serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": 257, "content": "<|im_end|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": byte_level(false),
        "post_processor": null,
        "decoder": byte_level(true),
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "vocab": vocab, "merges": ["h e"]}
    })
    .to_string()
}

/// A tiny model of `arch` (1 or 2 layers, 32 wide, heads of 8) with its tokenizer in the
/// metadata; weights `ty` (F32 or Q8_0: rows of 32).
pub fn tiny_model(arch: &str, ty: TensorType, layers: usize) -> Vec<u8> {
    let (e, heads, kv_heads, hd, ff) = (32usize, 4usize, 2usize, 8usize, 64usize);
    let sentencepiece = arch == "gemma3";
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    w.add("general.architecture", arch)
        .add(key("block_count"), layers as u32)
        .add(key("context_length"), 64u32)
        .add(key("embedding_length"), e as u32)
        .add(key("feed_forward_length"), ff as u32)
        .add(key("attention.head_count"), heads as u32)
        .add(key("attention.head_count_kv"), kv_heads as u32)
        .add(key("attention.key_length"), hd as u32)
        .add(key("attention.value_length"), hd as u32)
        .add(key("rope.dimension_count"), hd as u32)
        .add(key("rope.freq_base"), 10000f32)
        .add(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    if sentencepiece {
        w.add(key("attention.sliding_window"), 4u32);
    }
    // Vocabulary: SentencePiece (specials, byte fallback, "▁", "▁h") or byte-level BPE.
    let (tokens, types, vocab) = if sentencepiece {
        let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
            .map(String::from)
            .into();
        let mut types = vec![3i32, 3, 3, 2];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        tokens.extend([
            "▁".to_string(),
            "▁h".to_string(),
            "<start_of_turn>".into(),
            "<end_of_turn>".into(),
        ]);
        types.extend([1, 1, 3, 3]);
        let n = tokens.len();
        (tokens, types, n)
    } else {
        let mut tokens = byte_symbols();
        tokens.push("he".into());
        tokens.push("<|im_start|>".into());
        tokens.push("<|im_end|>".into());
        let mut types = vec![1i32; 257];
        types.extend([3, 3]);
        let n = tokens.len();
        (tokens, types, n)
    };
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
    )
    .add(
        "tokenizer.ggml.token_type",
        Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
    );
    if sentencepiece {
        let scores: Vec<Value> = (0..vocab).map(|i| Value::F32(-(i as f32))).collect();
        w.add("tokenizer.ggml.model", "llama")
            .add("tokenizer.ggml.scores", Value::Array(scores))
            .add("tokenizer.ggml.bos_token_id", 2u32)
            .add("tokenizer.ggml.eos_token_id", 1u32)
            .add("tokenizer.ggml.unknown_token_id", 3u32)
            .add("tokenizer.ggml.add_bos_token", true)
            .add(
                "tokenizer.chat_template",
                "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content|trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
            );
    } else {
        w.add("tokenizer.ggml.model", "gpt2")
            .add(
                "tokenizer.ggml.pre",
                if arch == "llama" { "default" } else { "qwen2" },
            )
            .add(
                "tokenizer.ggml.merges",
                Value::Array(vec![Value::String("h e".into())]),
            )
            .add("tokenizer.ggml.eos_token_id", (vocab - 1) as u32)
            .add("tokenizer.chat_template", CHATML);
    }
    // Tensors: values from a small LCG, so every seed's forward pass is finite.
    let mut state = 0x2545f491u32;
    let mut values = |n: usize, around: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                around + ((state >> 8) as f32 / (1 << 24) as f32 - 0.5) * 0.1
            })
            .collect()
    };
    let mut matrix = |w: &mut GgufWriter, name: String, cols: usize, rows: usize| {
        let v = values(cols * rows, 0.0);
        let dims = [cols as u64, rows as u64];
        match ty {
            TensorType::Q8_0 => {
                w.add_tensor(name, ty, &dims, quantize_q8_0(&v));
            }
            _ => {
                w.add_f32_tensor(name, &dims, &v);
            }
        }
    };
    let (q, kv) = (heads * hd, kv_heads * hd);
    matrix(&mut w, "token_embd.weight".into(), e, vocab);
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let norm = |w: &mut GgufWriter, name: String, len: usize, v: Vec<f32>| {
            w.add_f32_tensor(name, &[len as u64], &v);
        };
        norm(&mut w, n("attn_norm.weight"), e, vec![1.0; e]);
        matrix(&mut w, n("attn_q.weight"), e, q);
        matrix(&mut w, n("attn_k.weight"), e, kv);
        matrix(&mut w, n("attn_v.weight"), e, kv);
        if arch == "qwen2" {
            for (s, len) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                norm(&mut w, n(s), len, vec![0.01; len]);
            }
        }
        if arch == "qwen3" || arch == "gemma3" {
            norm(&mut w, n("attn_q_norm.weight"), hd, vec![1.0; hd]);
            norm(&mut w, n("attn_k_norm.weight"), hd, vec![0.5; hd]);
        }
        matrix(&mut w, n("attn_output.weight"), q, e);
        norm(&mut w, n("ffn_norm.weight"), e, vec![1.0; e]);
        matrix(&mut w, n("ffn_gate.weight"), e, ff);
        matrix(&mut w, n("ffn_up.weight"), e, ff);
        matrix(&mut w, n("ffn_down.weight"), ff, e);
        if arch == "gemma3" {
            norm(&mut w, n("post_attention_norm.weight"), e, vec![1.0; e]);
            norm(&mut w, n("post_ffw_norm.weight"), e, vec![1.0; e]);
        }
    }
    w.add_f32_tensor("output_norm.weight", &[e as u64], &vec![1.0; e]);
    w.finish().expect("a valid tiny model")
}

/// Q8_0 blocks of 32: an f16 scale and 32 int8.
fn quantize_q8_0(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() / 32 * 34);
    for block in v.chunks(32) {
        let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&half_bits(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * inv).round() as i8 as u8));
    }
    out
}

fn half_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Every target's seeds: (target, file name, bytes).
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        for (ty, suffix) in [(TensorType::F32, "f32"), (TensorType::Q8_0, "q8_0")] {
            let bytes = tiny_model(arch, ty, if arch == "gemma3" { 2 } else { 1 });
            for target in ["gguf", "model", "tokenizer_gguf"] {
                out.push((target, format!("{arch}-{suffix}.gguf"), bytes.clone()));
            }
        }
    }
    out.push((
        "tokenizer_json",
        "byte-level-bpe.json".into(),
        tokenizer_json().into_bytes(),
    ));
    out.push((
        "chat_template",
        "chatml.jinja".into(),
        CHATML.as_bytes().to_vec(),
    ));
    let llama = include_str!("../../../scripts/llama-3.2-chat-template.jinja");
    out.push((
        "chat_template",
        "llama-3.2.jinja".into(),
        llama.as_bytes().to_vec(),
    ));
    for (name, source) in TEMPLATES {
        out.push((
            "chat_template",
            format!("{name}.jinja"),
            source.as_bytes().to_vec(),
        ));
    }
    out
}
