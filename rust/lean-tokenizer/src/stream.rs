use crate::{Tokenizer, TokenizerError};

/// Streaming detokenization: push ids one at a time and get the text they add.
///
/// A byte-level token can end in the middle of a UTF-8 character; the decoder then holds the text
/// back (the decode of an incomplete character ends in U+FFFD) until a later token completes it.
/// Decoders that treat the first token specially (e.g. SentencePiece's leading space) are handled
/// by decoding each new id together with the ids already emitted since the last flush point and
/// emitting only the difference. The concatenation of every `push` output and `finish` equals
/// `tokenizer.decode(all ids, skip_special_tokens)`.
///
/// The decoder does not borrow the tokenizer, so that it can live next to it in one owned state
/// (a generation resumed across calls); every call takes it instead, and it must be the same
/// tokenizer each time.
#[derive(Clone, Debug)]
pub struct StreamDecoder {
    skip_special_tokens: bool,
    /// Ids from the last flush point on: `ids[..read]` are already emitted as `emitted`'s text.
    ids: Vec<u32>,
    read: usize,
    /// The decode of `ids[..read]`.
    emitted: String,
}

impl StreamDecoder {
    pub fn new(skip_special_tokens: bool) -> Self {
        StreamDecoder {
            skip_special_tokens,
            ids: Vec::new(),
            read: 0,
            emitted: String::new(),
        }
    }

    /// Adds `id`; returns the new text, or `None` while nothing complete is new.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: u32,
    ) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let text = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.len() <= self.emitted.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let new_text = self.new_text(&text)?;
        // Keep the just-emitted ids as context for the next decode, drop the older ones.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.emitted = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        Ok(Some(new_text))
    }

    /// The text still held back (an incomplete character at the end decodes to U+FFFD, as in
    /// `decode`); empty when everything was emitted.
    pub fn finish(self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let text = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        self.new_text(&text)
    }

    fn new_text(&self, text: &str) -> Result<String, TokenizerError> {
        match text.strip_prefix(self.emitted.as_str()) {
            Some(new_text) => Ok(new_text.to_string()),
            // Only a decoder whose output for a prefix of ids is not a prefix of the output for
            // all ids gets here; the text emitted so far cannot be taken back.
            None => Err(TokenizerError::Decode(format!(
                "streaming: decoding {:?} gives {text:?}, which does not continue the text already emitted {:?}",
                self.ids, self.emitted
            ))),
        }
    }
}
