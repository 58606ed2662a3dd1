//! Stop strings, cut exactly: a stop string may arrive split over several tokens, so text that
//! could still be the start of one is held back until the next piece says whether it is.
//! The stop string itself is never emitted.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What one piece of text gives: the text that is safe to emit, and the stop string that ended
/// the output, if one did (nothing after it may be emitted).
#[derive(Debug, PartialEq)]
pub struct Matched {
    pub text: String,
    pub stop: Option<String>,
}

impl StopMatcher {
    /// Empty stop strings are dropped (they would match before any text).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    pub fn push(&mut self, piece: &str) -> Matched {
        self.held.push_str(piece);
        let first = self.stops.iter().filter_map(|s| Some((self.held.find(s.as_str())?, s))).min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Matched { text, stop: Some(stop.clone()) };
        }
        let keep = partial_suffix(&self.held, self.stops.iter().map(String::as_str));
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Matched { text, stop: None }
    }

    /// The text still held back when the output ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Bytes at the end of `held` that begin one of `markers` without completing it (the longest
/// such tail): text that must wait for the next piece.
pub fn partial_suffix<'a>(held: &str, markers: impl IntoIterator<Item = &'a str>) -> usize {
    markers
        .into_iter()
        .filter_map(|m| {
            (1..m.len().min(held.len() + 1))
                .rev()
                .find(|&n| held.is_char_boundary(held.len() - n) && m.as_bytes().starts_with(&held.as_bytes()[held.len() - n..]))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out += &r.text;
            if r.stop.is_some() {
                return (out, true);
            }
        }
        out += &m.finish();
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_never_emits_the_stop() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["END"], &["hello EN", "d"]), ("hello ENd".into(), false));
        assert_eq!(run(&["\n\n", "."], &["a\n", "b. c"]), ("a\nb".into(), true));
        // The earliest stop wins, whichever string it is.
        assert_eq!(run(&["zz", "b"], &["azz b"]), ("a".into(), true));
        let mut m = StopMatcher::new(vec!["b".into(), "zz".into()]);
        assert_eq!(m.push("azz b"), Matched { text: "a".into(), stop: Some("zz".into()) });
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), false));
    }

    #[test]
    fn held_text_is_released_as_soon_as_it_cannot_start_a_stop() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("x ST").text, "x ");
        assert_eq!(m.push("A").text, "STA");
        assert_eq!(m.push("é S").text, "é ");
        assert_eq!(m.finish(), "S");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
        assert_eq!(run(&["日本"], &["今日", "本"]), ("今".into(), true));
    }
}
