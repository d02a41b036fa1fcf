//! nccl-tests' number formats, and and the JSON type (`oxccl_core::json`) for `-J` and `--plot`.

/// C's `%*.{p}e`: mantissa with `p` decimals, exponent with a sign and at least two digits.
fn c_exp(v: f64, prec: usize) -> String {
    let s = format!("{v:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// nccl-tests' `getFloatStr`: the value in `width` columns with 2, 1 or 0 decimals, else in
/// exponent form.
pub fn float_str(v: f64, width: usize) -> String {
    for p in [2usize, 1, 0] {
        let s = format!("{v:>width$.p$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = c_exp(v, if width >= 7 { 1 } else { 0 });
    format!("{s:>width$}")
}

/// C's `%6g` for a count.
pub fn g6(v: f64) -> String {
    let s = if v.abs() < 1e6 && v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        let e = c_exp(v, 5);
        // %g drops trailing zeros of the mantissa.
        match e.split_once('e') {
            Some((m, x)) => format!("{}e{x}", m.trim_end_matches('0').trim_end_matches('.')),
            None => e,
        }
    };
    format!("{s:>6}")
}

pub use oxccl_core::json::{obj, Json};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_formats() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(g6(0.0), "     0");
        assert_eq!(g6(42.0), "    42");
        assert_eq!(g6(1234567.0), "1.23457e+06");
    }
}
