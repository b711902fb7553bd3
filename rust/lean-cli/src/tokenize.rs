//! `lean-cli tokenize`: the ids of a text, as a prompt given with `--raw` is encoded
//! (transformers' `tokenizer(text)`: special-token text kept whole, the tokenizer's bos/eos added
//! where it adds them). Reads only the GGUF's metadata, so it also works for models whose
//! architecture lean does not run.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use lean::gguf::{Gguf, GgufError};

use crate::{CliResult, TokenizerSource};

#[derive(Args)]
pub struct TokenizeArgs {
    /// The GGUF model file.
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// tokenizer.json or its directory, or `gguf` (default: next to the model, else the GGUF's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The text; without it, JSON Lines from stdin (one JSON string a line), one JSON array of ids
    /// a line out.
    text: Option<String>,
    /// Each input is a chat, a JSON array of `{"role", "content"}` messages: the ids of the chat
    /// prompt as `lean-cli` would encode it (the model's chat template, the assistant's turn
    /// opened).
    #[arg(long)]
    chat: bool,
    /// With `--chat`: print the template's text (a JSON string) instead of ids, e.g. to give
    /// another engine the same prompt.
    #[arg(long, requires = "chat")]
    template_text: bool,
}

/// One input's output line: its ids, or with `--chat --template-text` the chat prompt's text.
fn line_for(tokenizer: &lean::Tokenizer, args: &TokenizeArgs, input: &str) -> CliResult<String> {
    if !args.chat {
        return Ok(serde_json::to_string(&tokenizer.encode(input, true)?)?);
    }
    let messages: Vec<lean::ChatMessage> = serde_json::from_str(input).map_err(|e| {
        format!("a chat is a JSON array of {{\"role\", \"content\"}} messages: {e}")
    })?;
    Ok(match args.template_text {
        true => serde_json::to_string(&tokenizer.apply_chat_template(&messages, true)?)?,
        false => serde_json::to_string(&tokenizer.encode_chat(&messages, true)?)?,
    })
}

pub fn run(args: TokenizeArgs) -> CliResult {
    if !args.model.is_file() {
        return Err(format!("{}: no such model file", args.model.display()).into());
    }
    let source = TokenizerSource::choose(&args.model, args.tokenizer.as_ref());
    let gguf = read_header(&args.model)?;
    let tokenizer = source.load(&gguf)?;
    let mut out = std::io::stdout().lock();
    if let Some(text) = &args.text {
        writeln!(out, "{}", line_for(&tokenizer, &args, text)?)?;
        return Ok(());
    }
    for (index, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let input = match args.chat {
            true => line,
            false => serde_json::from_str(&line)
                .map_err(|e| format!("stdin line {}: not a JSON string: {e}", index + 1))?,
        };
        let output = line_for(&tokenizer, &args, &input)
            .map_err(|e| format!("stdin line {}: {e}", index + 1))?;
        writeln!(out, "{output}")?;
    }
    Ok(())
}

/// The GGUF's metadata and tensor infos, from as many of the file's first bytes as they take.
fn read_header(path: &Path) -> CliResult<Gguf> {
    let file_len = std::fs::metadata(path)?.len();
    let mut want: u64 = 4 << 20;
    loop {
        let mut prefix = Vec::new();
        std::fs::File::open(path)?
            .take(want)
            .read_to_end(&mut prefix)?;
        match Gguf::parse_header(&prefix, file_len) {
            Ok(gguf) => return Ok(gguf),
            Err(GgufError::NeedMoreBytes { .. }) if want < file_len => want *= 4,
            Err(e) => return Err(format!("{}: {e}", path.display()).into()),
        }
    }
}
