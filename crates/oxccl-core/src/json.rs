//! What oxccl's JSON file formats share. Each format (topology files, cluster files, the
//! calibration cache, flight recorder dumps, benchmark and simulator results) is a serde type
//! of the module that owns it, read and written with serde_json through this module.
//!
//! Rules:
//! - Reading never panics. An error says what was wrong and where: serde_json's message ends
//!   "at line L column C". This crate does no I/O, so the caller that read the file puts its
//!   path in front ("PATH: …").
//! - Integers are integer fields (`u64` values above 2^53 round-trip exactly); strings are
//!   full JSON strings (every escape, surrogate pairs); "+1", `NaN` and trailing text are
//!   refused.
//! - A number that is not finite (±inf, NaN) is written as `null`. Fields that may hold one are
//!   `Option<f64>` filled through [`finite`], so a reader sees `null` as "no value"; a
//!   required number that is `null` is an error naming its place.
//! - A format that starts with a version mark (`"oxccl_topo": 1`) is checked for it first
//!   ([`check_mark`]), so a file of another kind is refused as such rather than for its first
//!   field that does not fit; the mark's field is a [`Mark`].

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Reads `text` as a `T`; the error says what and where (line and column).
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// `v` as compact JSON text.
pub fn to_text<T: Serialize>(v: &T) -> String {
    // The formats are structs, sequences, options and enums with string names, which
    // serde_json always writes (it fails only for maps whose keys are not strings).
    serde_json::to_string(v).expect("oxccl's JSON formats always serialize")
}

/// `x` when it is finite; `None` (written `null`) for ±inf and NaN.
pub fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// Checks that `text` is an object whose `key` is the number `version` (a format's mark);
/// `what` names the format in the error ("an oxccl topology").
pub fn check_mark(text: &str, key: &str, version: u32, what: &str) -> Result<(), String> {
    let top: serde_json::Map<String, serde_json::Value> = parse(text)?;
    match top.get(key).and_then(serde_json::Value::as_f64) {
        Some(v) if v == f64::from(version) => Ok(()),
        Some(v) => Err(format!("not {what} of version {version} (\"{key}\": {v})")),
        None => Err(format!("not {what} (\"{key}\": {version} missing)")),
    }
}

/// A format's version mark: written as `V`; read as anything, since [`check_mark`] has
/// checked it before the whole file is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark<const V: u32>;

impl<const V: u32> Serialize for Mark<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(V)
    }
}

impl<'de, const V: u32> Deserialize<'de> for Mark<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Mark)
    }
}

/// What the formats' tests share: where serde_json says an error is, and proptest strategies.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    /// Where byte `at` of `text` is, as serde_json says it: "line L column C", 1-based.
    fn place_at(text: &str, at: usize) -> String {
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        format!("line {line} column {}", before.rsplit('\n').next().unwrap_or("").chars().count() + 1)
    }

    /// Where the first `needle` in `text` starts (serde_json points at the first wrong character
    /// of malformed text).
    pub(crate) fn place(text: &str, needle: &str) -> String {
        place_at(text, text.find(needle).expect("the needle is in the text"))
    }

    /// Where the first `needle` in `text` ends (serde_json points at the last character of a
    /// value of the wrong type or out of range).
    pub(crate) fn place_end(text: &str, needle: &str) -> String {
        let start = text.find(needle).expect("the needle is in the text");
        place_at(text, start + needle.char_indices().last().map_or(0, |(i, _)| i))
    }

    /// Any text, with the characters JSON codecs get wrong (`\b`, `\f`, `\r`, quotes, a
    /// character outside the BMP) more likely.
    pub(crate) fn text() -> impl Strategy<Value = String> {
        let c = prop_oneof![any::<char>(), Just('\u{8}'), Just('\u{c}'), Just('\r'), Just('"'), Just('😀')];
        prop::collection::vec(c, 0..8).prop_map(String::from_iter)
    }

    /// Any positive finite number, subnormals included.
    pub(crate) fn positive() -> impl Strategy<Value = f64> {
        prop::num::f64::POSITIVE | prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL
    }
}

#[cfg(test)]
mod tests {
    use super::testing::place;
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct T {
        mark: Mark<3>,
        s: String,
        n: u64,
        x: Option<f64>,
    }

    #[test]
    fn strings_numbers_and_marks_follow_json_exactly() {
        let t: T = parse(
            r#"{"mark": 3, "s": "\b\f\r\t\n\"\\\/\u00e9\ud83d\ude00", "n": 18446744073709551615, "x": null}"#,
        )
        .unwrap();
        assert_eq!(t, T { mark: Mark, s: "\u{8}\u{c}\r\t\n\"\\/é😀".into(), n: u64::MAX, x: None });
        assert_eq!(to_text(&t), r#"{"mark":3,"s":"\b\f\r\t\n\"\\/é😀","n":18446744073709551615,"x":null}"#);
        let inf = T { mark: Mark, s: String::new(), n: (1 << 53) + 1, x: finite(f64::INFINITY) };
        assert_eq!(to_text(&inf), r#"{"mark":3,"s":"","n":9007199254740993,"x":null}"#);
        assert_eq!(parse::<T>(&to_text(&inf)).unwrap(), inf);
        assert_eq!(finite(f64::NAN), None);
        assert_eq!(finite(-0.5), Some(-0.5));
    }

    #[test]
    fn malformed_text_is_refused_with_its_place() {
        let plus = "{\"mark\": 3, \"s\": \"a\", \"n\": +1, \"x\": 1}";
        assert_eq!(parse::<T>(plus).unwrap_err(), format!("expected value at {}", place(plus, "+")));
        let e = parse::<T>("{\"mark\": 3,\n \"s\": \"a\",\n \"n\": 1").unwrap_err();
        assert_eq!(e, "EOF while parsing an object at line 3 column 7");
        let e = parse::<T>("{\"mark\": 3, \"s\": \"\\ud83d\", \"n\": 1}").unwrap_err();
        assert_eq!(e, "unexpected end of hex escape at line 1 column 25");
        let nan = "{\"mark\": 3, \"s\": \"a\", \"n\": 1, \"x\": NaN}";
        assert_eq!(parse::<T>(nan).unwrap_err(), format!("expected value at {}", place(nan, "NaN")));
        let trailing = "{\"mark\": 3, \"s\": \"a\", \"n\": 1} x";
        assert_eq!(
            parse::<T>(trailing).unwrap_err(),
            format!("trailing characters at {}", place(trailing, "x"))
        );
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert_eq!(
            parse::<serde_json::Value>(&deep).unwrap_err(),
            "recursion limit exceeded at line 1 column 128"
        );
    }

    #[test]
    fn the_mark_is_checked_first() {
        assert_eq!(check_mark("{\"m\": 1, \"rest\": []}", "m", 1, "a test file"), Ok(()));
        assert_eq!(check_mark("{\"m\": 1.0}", "m", 1, "a test file"), Ok(()));
        assert_eq!(
            check_mark("{\"m\": 2}", "m", 1, "a test file").unwrap_err(),
            "not a test file of version 1 (\"m\": 2)"
        );
        assert_eq!(
            check_mark("{}", "m", 1, "a test file").unwrap_err(),
            "not a test file (\"m\": 1 missing)"
        );
        assert_eq!(
            check_mark("[1]", "m", 1, "a test file").unwrap_err(),
            "invalid type: sequence, expected a map at line 1 column 0"
        );
    }
}
