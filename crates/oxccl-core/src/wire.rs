//! A small little-endian encoding for control messages, with bounds-checked decoding.
//!
//! Decoding never panics and never allocates more than the input holds: every length read
//! from the wire is checked against the bytes that remain before it is used.

use crate::error::CoreError;

/// Builds a message.
#[derive(Default, Debug, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty message.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Raw bytes, no length (the reader must know it).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// Bytes with a u32 length prefix.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.raw(v)
    }

    /// A UTF-8 string with a u32 length prefix.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    /// The encoded message.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads a message built by [`Writer`].
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `buf`, which is a `what` (named in errors).
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        if self.buf.len() - self.pos < n {
            return Err(CoreError::malformed(
                self.what,
                format!(
                    "truncated: needs {n} more bytes at offset {}, has {}",
                    self.pos,
                    self.buf.len() - self.pos
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, CoreError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, CoreError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, CoreError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, CoreError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, CoreError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// `n` raw bytes.
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        self.take(n)
    }

    /// Fixed-size raw bytes.
    pub fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        self.array()
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], CoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str, CoreError> {
        let what = self.what;
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| CoreError::malformed(what, "string is not UTF-8"))
    }

    /// Checks that the whole message was consumed.
    pub fn finish(&self) -> Result<(), CoreError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(CoreError::malformed(self.what, format!("{} trailing bytes", self.buf.len() - self.pos)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let msg = Writer::new().u8(7).u32(0xdead_beef).str("héllo").u64(u64::MAX).finish();
        let mut r = Reader::new(&msg, "test message");
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u32().unwrap(), 0xdead_beef);
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.u64().unwrap(), u64::MAX);
        r.finish().unwrap();
        for cut in 0..msg.len() {
            let mut r = Reader::new(&msg[..cut], "test message");
            let ok = r.u8().and_then(|_| r.u32()).and_then(|_| r.str().map(|_| ())).and_then(|_| r.u64());
            assert!(ok.is_err(), "cut at {cut}");
        }
        // A huge length prefix is refused without allocating.
        let bad = Writer::new().u32(u32::MAX).finish();
        assert!(Reader::new(&bad, "m").bytes().is_err());
    }
}
