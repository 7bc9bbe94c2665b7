//! What ends a generation.
//!
//! - [`stop_tokens`]: the checkpoint's stop token ids: `eos_token_id` of
//!   `generation_config.json`, else of `config.json` (top level or its
//!   `text_config`), else the tokenizer's `eos_token` — the order
//!   transformers' `generate` resolves them in.
//! - [`StopStrings`]: a request's stop strings (OpenAI `stop`) matched in the
//!   streamed, detokenized text, holding back whatever could still become one.

use std::path::Path;

use super::{TextError, Tokenizer, read_json_if_present, template::special_token};

/// The stop token ids of the checkpoint at `dir` (possibly empty).
pub fn stop_tokens(dir: &Path, tokenizer: &Tokenizer) -> Result<Vec<u32>, TextError> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        let Some(json) = read_json_if_present(&path)? else { continue };
        let field = match json.get("eos_token_id") {
            Some(v) if !v.is_null() => Some(v),
            _ => json.get("text_config").and_then(|t| t.get("eos_token_id")).filter(|v| !v.is_null()),
        };
        if let Some(v) = field {
            return ids(v).ok_or_else(|| TextError::Invalid {
                path,
                what: format!("eos_token_id {v} is neither a token id nor a list of them"),
            });
        }
    }
    let path = dir.join("tokenizer_config.json");
    let eos = read_json_if_present(&path)?.and_then(|c| special_token(&c, "eos_token"));
    Ok(eos.and_then(|t| tokenizer.token_id(&t)).into_iter().collect())
}

fn ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        serde_json::Value::Array(items) => items.iter().map(one).collect(),
        _ => one(v).map(|x| vec![x]),
    }
}

/// A stop string that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopStringError {
    /// The stop string at `index` is empty (it would match before any text).
    #[error("stop string {index} is empty")]
    Empty { index: usize },
}

/// What one [`StopStrings::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopScan {
    /// The text safe to send now. When `stopped` is set, everything before the
    /// match that was not sent yet; the stop string and what follows it are dropped.
    pub emit: String,
    /// The index (in the list given to [`StopStrings::new`]) of the stop string
    /// that matched; the generation must end.
    pub stopped: Option<usize>,
}

/// Matches a request's stop strings in streamed text.
///
/// The text is fed piece by piece as it is detokenized. Text is released only
/// once it can no longer be part of a match: the longest suffix of the pending
/// text that is a prefix of some stop string is held back until later text
/// rules the match out (it is then released) or completes it (it is then
/// dropped, with the stop string and anything after it in the same piece).
///
/// **Which match.** The generation ends at the first point of the text where
/// some stop string is complete, as if the text arrived one character at a
/// time: among the occurrences, the one that *ends* first wins; among those
/// ending at the same place, the one starting earliest (the longest); two
/// stops equal in both are the same string, and the first listed is reported.
/// This is the earliest occurrence by start offset except when one occurrence
/// lies strictly inside another (stops `"abcd"` and `"bc"` on `"abcd"`): there
/// the inner one completes first, and choosing the outer one would depend on
/// how the text happened to be split into pieces (`"abc"` then `"d"` must stop
/// at `"bc"`, since the generation ends as soon as a stop string appears). The
/// result is therefore the same for every split of the same text.
///
/// Matching is on the text as given (byte-exact, case-sensitive); matches and
/// held-back text always fall on character boundaries, since a UTF-8 string
/// only occurs in another at character boundaries. With no stop strings every
/// piece is passed through at once.
#[derive(Debug, Clone)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not released: a possible start of a stop string.
    pending: String,
    /// The stop that matched, once one has.
    stopped: Option<usize>,
}

impl StopStrings {
    /// A matcher for `stops` (possibly none); refuses an empty stop string.
    pub fn new(stops: Vec<String>) -> Result<Self, StopStringError> {
        if let Some(index) = stops.iter().position(String::is_empty) {
            return Err(StopStringError::Empty { index });
        }
        Ok(Self { stops, pending: String::new(), stopped: None })
    }

    /// The stop strings, in the order given.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The index of the stop string that matched, if one has.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Feeds the next piece of text. Returns the text safe to emit now and,
    /// when a stop string has matched, which one: the generation must then
    /// end. Once stopped, further pushes are ignored (they emit nothing and
    /// report the same stop again).
    pub fn push(&mut self, piece: &str) -> StopScan {
        if let Some(index) = self.stopped {
            return StopScan { emit: String::new(), stopped: Some(index) };
        }
        if self.stops.is_empty() {
            return StopScan { emit: piece.to_owned(), stopped: None };
        }
        self.pending.push_str(piece);
        // The held-back text holds no complete stop (it would have matched), so
        // every occurrence found now is new; the first occurrence of each stop
        // is the one of it that ends first.
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| {
                self.pending.find(stop.as_str()).map(|start| (start + stop.len(), start, index))
            })
            .min();
        if let Some((_, start, index)) = first {
            self.pending.truncate(start);
            self.stopped = Some(index);
            return StopScan { emit: std::mem::take(&mut self.pending), stopped: Some(index) };
        }
        let keep = self.held_back();
        let rest = self.pending.split_off(self.pending.len() - keep);
        StopScan { emit: std::mem::replace(&mut self.pending, rest), stopped: None }
    }

    /// The generation ended without a stop string: releases the held-back text
    /// (no match is possible any more). Empty once stopped.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// The length in bytes of the longest suffix of the pending text that is a
    /// proper prefix of some stop string.
    fn held_back(&self) -> usize {
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        let text = self.pending.as_bytes();
        (1..=longest.min(text.len()))
            .rev()
            .find(|&n| {
                self.pending.is_char_boundary(text.len() - n)
                    && self.stops.iter().any(|s| s.as_bytes().starts_with(&text[text.len() - n..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_is_an_id_or_a_list() {
        assert_eq!(ids(&serde_json::json!(7)), Some(vec![7]));
        assert_eq!(ids(&serde_json::json!([1, 107])), Some(vec![1, 107]));
        assert_eq!(ids(&serde_json::json!("x")), None);
        assert_eq!(ids(&serde_json::json!([1, -2])), None);
    }

    /// Feeds `pieces`, returning the emitted text (including `finish` when no
    /// stop matched) and the stop.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopStrings::new(stops.iter().map(|s| s.to_string()).collect()).expect("stops");
        let mut out = String::new();
        for piece in pieces {
            let scan = m.push(piece);
            out.push_str(&scan.emit);
            if scan.stopped.is_some() {
                return (out, scan.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn empty_stop_strings_are_refused() {
        let err = StopStrings::new(vec!["ok".into(), String::new()]).expect_err("empty");
        assert_eq!(err, StopStringError::Empty { index: 1 });
        assert_eq!(err.to_string(), "stop string 1 is empty");
    }

    #[test]
    fn no_stops_pass_through_without_holding_back() {
        let mut m = StopStrings::new(vec![]).expect("stops");
        for piece in ["Hel", "lo, ", "wörld", ""] {
            assert_eq!(m.push(piece), StopScan { emit: piece.into(), stopped: None });
        }
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn a_match_split_across_many_pieces_is_found_and_never_emitted() {
        let mut m = StopStrings::new(vec!["</answer>".into()]).expect("stops");
        assert_eq!(m.push("The result is 42"), StopScan { emit: "The result is 42".into(), stopped: None });
        assert_eq!(m.push(".<"), StopScan { emit: ".".into(), stopped: None });
        for piece in ["/", "ans", "w", "er"] {
            assert_eq!(m.push(piece), StopScan::default(), "{piece}");
        }
        assert_eq!(m.push(">"), StopScan { emit: String::new(), stopped: Some(0) });
        assert_eq!(m.stopped(), Some(0));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn a_held_prefix_that_stops_matching_is_released() {
        let mut m = StopStrings::new(vec!["STOP".into()]).expect("stops");
        assert_eq!(m.push("go ST"), StopScan { emit: "go ".into(), stopped: None });
        assert_eq!(m.push("O"), StopScan::default());
        // "STOX" rules out the match; nothing of it can start one.
        assert_eq!(m.push("X and S"), StopScan { emit: "STOX and ".into(), stopped: None });
        // A release that leaves a new possible start holds it back again.
        assert_eq!(m.push("TS"), StopScan { emit: "ST".into(), stopped: None });
        assert_eq!(m.push("TO"), StopScan::default());
        assert_eq!(m.push("P!"), StopScan { emit: String::new(), stopped: Some(0) });
    }

    #[test]
    fn text_after_the_match_is_dropped() {
        assert_eq!(run(&["\n\n"], &["one\n", "\ntwo three"]), ("one".into(), Some(0)));
        assert_eq!(run(&["END"], &["a END b END c"]), ("a ".into(), Some(0)));
        let mut m = StopStrings::new(vec!["x".into()]).expect("stops");
        assert_eq!(m.push("abxcd"), StopScan { emit: "ab".into(), stopped: Some(0) });
        // Pushing on after the stop is ignored.
        assert_eq!(m.push("more"), StopScan { emit: String::new(), stopped: Some(0) });
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn finish_releases_the_held_back_text() {
        let mut m = StopStrings::new(vec!["<|end|>".into(), "###".into()]).expect("stops");
        assert_eq!(m.push("done <|en"), StopScan { emit: "done ".into(), stopped: None });
        assert_eq!(m.finish(), "<|en");
        assert_eq!(run(&["###"], &["a #", "#"]), ("a ##".into(), None));
    }

    #[test]
    fn overlapping_stops_take_the_occurrence_that_completes_first() {
        // Same piece, two stops: the earlier start wins, whatever the list order.
        assert_eq!(run(&["cd", "bc"], &["abcde"]), ("a".into(), Some(1)));
        assert_eq!(run(&["bc", "cd"], &["abcde"]), ("a".into(), Some(0)));
        // Same end: the earliest start (the longest) wins.
        assert_eq!(run(&["bc", "abc"], &["xabc"]), ("x".into(), Some(1)));
        // Same start: the shorter one completes first.
        assert_eq!(run(&["abc", "ab"], &["xabc"]), ("x".into(), Some(1)));
        // One inside the other: the inner one completes first, however split.
        assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".into(), Some(1)));
        assert_eq!(run(&["abcd", "bc"], &["abc", "d"]), ("a".into(), Some(1)));
        assert_eq!(run(&["aab", "ab"], &["xa", "a", "b"]), ("x".into(), Some(0)));
        // A held prefix of one stop that completes another.
        assert_eq!(run(&["aaab", "aa"], &["xa", "a", "ab"]), ("x".into(), Some(1)));
        // The longest held suffix covers a shorter candidate start.
        assert_eq!(run(&["abab", "bac"], &["xab", "a", "c"]), ("xa".into(), Some(1)));
        assert_eq!(run(&["abab", "bac"], &["xab", "a", "b"]), ("x".into(), Some(0)));
        // Duplicates report the first listed.
        assert_eq!(run(&["z", "z"], &["yz"]), ("y".into(), Some(0)));
    }

    #[test]
    fn multibyte_text_is_held_and_cut_on_character_boundaries() {
        let mut m = StopStrings::new(vec!["終わり".into(), "é!".into()]).expect("stops");
        assert_eq!(m.push("これで終"), StopScan { emit: "これで".into(), stopped: None });
        assert_eq!(m.push("了"), StopScan { emit: "終了".into(), stopped: None });
        // "ê" shares its first byte with "é" but is not a prefix of "é!".
        assert_eq!(m.push("ê"), StopScan { emit: "ê".into(), stopped: None });
        assert_eq!(m.push("é"), StopScan::default());
        assert_eq!(m.push("é"), StopScan { emit: "é".into(), stopped: None });
        assert_eq!(m.push("!🎉"), StopScan { emit: String::new(), stopped: Some(1) });
        assert_eq!(run(&["終わり"], &["日本語", "終わ", "り。次"]), ("日本語".into(), Some(0)));
        assert_eq!(run(&["🎉"], &["a🎉b"]), ("a".into(), Some(0)));
    }

    #[test]
    fn every_split_of_a_text_gives_what_feeding_it_a_character_at_a_time_gives() {
        let cases: &[(&[&str], &str)] = &[
            (&["abcd", "bc"], "xxabcdyy"),
            (&["aab", "ab", "ba"], "aaabba"),
            (&["abab", "bac"], "ababacab"),
            (&["終わり", "わり。"], "終わ終わり。"),
            (&["STOP", "TOPS"], "STSTOTOPS"),
            (&["zz"], "no match here, z"),
        ];
        let mut seed = 0x9e37_79b9_u32;
        for &(stops, text) in cases {
            let chars: Vec<&str> = text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect();
            let expected = run(stops, &chars);
            for _ in 0..200 {
                let mut pieces = Vec::new();
                let mut start = 0;
                for (i, _) in text.char_indices().skip(1) {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    if seed >> 30 == 0 {
                        pieces.push(&text[start..i]);
                        start = i;
                    }
                }
                pieces.push(&text[start..]);
                assert_eq!(run(stops, &pieces), expected, "{stops:?} {pieces:?}");
            }
        }
    }
}
