//! OpenAI's `stop` strings: the text is cut before the first one and generation ends there.
//! A stop string may arrive split across tokens, so text that could still grow into one is held
//! back until the next token settles it; what a stream sends is then exactly the final text.

pub struct StopStrings {
    stops: Vec<String>,
    /// Generated text not yet released: a tail that is the start of some stop string.
    held: String,
}

impl StopStrings {
    /// `stops` must not contain the empty string (the request checks).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops,
            held: String::new(),
        }
    }

    /// Adds a token's text; returns the text that is now final, and whether a stop string ended
    /// the generation (the returned text then stops right before it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let released = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (released, false)
    }

    /// The text held back when the generation ended without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopStrings;

    fn run(stops: &[&str], tokens: &[&str]) -> (Vec<String>, bool) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for t in tokens {
            let (text, stopped) = s.push(t);
            out.push(text);
            if stopped {
                return (out, true);
            }
        }
        out.push(s.finish());
        (out, false)
    }

    #[test]
    fn no_stops_release_everything_at_once() {
        assert_eq!(run(&[], &["a", "b"]).0, ["a", "b", ""]);
    }

    #[test]
    fn a_stop_split_across_tokens_is_held_then_cut() {
        let (out, stopped) = run(&["END"], &["one E", "N", "D two"]);
        assert!(stopped);
        assert_eq!(out, ["one ", "", ""]);
    }

    #[test]
    fn a_false_start_is_released_when_it_diverges() {
        let (out, stopped) = run(&["END"], &["one E", "Nx", " two"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "one ENx two");
        assert_eq!(out, ["one ", "ENx", " two", ""]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let (out, stopped) = run(&["world", "lo w"], &["hello world"]);
        assert!(stopped);
        assert_eq!(out, ["hel"]);
    }

    #[test]
    fn held_text_comes_out_at_the_end() {
        let (out, stopped) = run(&["\n\n"], &["a\n"]);
        assert!(!stopped);
        assert_eq!(out, ["a", "\n"]);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let (out, stopped) = run(&["é!"], &["café", "!"]);
        assert!(stopped);
        assert_eq!(out.concat(), "caf");
    }
}
