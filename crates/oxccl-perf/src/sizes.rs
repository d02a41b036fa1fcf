//! Sizes as nccl-tests writes them, shared by `oxccl-perf` and `oxccl sim`, and the one
//! sentence that says what they may be (for both programs' errors).

/// What a size may be, for an error about one that is not.
pub const SIZE_FORMS: &str =
    "a number of bytes, optionally with K, M or G (powers of 1024): 8, 64K, 1.5M, 1G";

/// Parses nccl-tests' sizes: a number with an optional K, M or G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1usize << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v: f64 = num.parse().ok()?;
    if !(v >= 0.0 && v.is_finite()) {
        return None;
    }
    Some((v * mult as f64) as usize)
}
