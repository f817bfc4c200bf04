//! Content digests. Only `sha256:<64 lowercase hex>` is accepted: anything else is refused
//! with the text that was wrong.

use std::fmt;
use std::io::{self, Read};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use thiserror::Error;

/// A digest that is not `sha256:<64 lowercase hex>`.
#[derive(Debug, Error)]
#[error("invalid digest {0:?}: expected sha256:<64 lowercase hex digits>")]
pub struct DigestError(pub String);

/// A validated `sha256:<hex>` content digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let ok = s.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(DigestError(s.chars().take(100).collect()))
        }
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:<hex>` text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Self, DigestError> {
        Self::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Bytes read so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The reader inside.
    pub(crate) fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Reads the rest to the end, then returns the digest and byte count of everything read,
    /// and the reader inside.
    pub(crate) fn finish(mut self) -> io::Result<(Digest, u64, R)> {
        io::copy(&mut self, &mut io::sink())?;
        let hex = hex::encode(self.hasher.finalize());
        Ok((Digest(format!("sha256:{hex}")), self.count, self.inner))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_hash() {
        let d = Digest::of(b"abc");
        assert_eq!(
            d.as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        for bad in [
            "",
            "sha256:",
            "sha512:ab",
            "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
        let mut r = HashingReader::new(&b"abc"[..]);
        let mut one = [0u8; 1];
        r.read_exact(&mut one).unwrap();
        assert_eq!(r.count(), 1);
        let (got, n, _) = r.finish().unwrap();
        assert_eq!((got, n), (d, 3));
    }
}
