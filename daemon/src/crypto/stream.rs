//! The vault's streaming AEAD format (SPEC section 7), for data of any length with bounded
//! memory.
//!
//! ```text
//! header  = magic "TPMVAEAD" | version u8 = 1 | name_len u8 | key name | key_id [16]
//!           | chunk_size u32 BE | nonce_prefix [7]
//! chunk i = AES-256-GCM(key, nonce = nonce_prefix || i as u32 BE || last u8,
//!                       aad = SHA-256(header) || context, plaintext_i) -- ciphertext || tag[16]
//! ```
//! Every chunk but the last carries exactly `chunk_size` plaintext bytes; the last carries
//! fewer (possibly zero) and has `last = 1`. So truncation (no final chunk), reordering
//! (counter), splicing from another stream (prefix, header hash) and a wrong key or context
//! (tag) are all detected, and a decryptor never releases a chunk before its tag verified.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

use crate::error::Error;

/// Format magic.
pub const MAGIC: &[u8; 8] = b"TPMVAEAD";
/// Format version.
pub const VERSION: u8 = 1;
/// Plaintext bytes per chunk.
pub const CHUNK: usize = 64 * 1024;
/// GCM tag length.
pub const TAG: usize = 16;
/// Length of the random part of every nonce.
const PREFIX: usize = 7;

/// A parsed stream header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Data key name.
    pub key_name: String,
    /// Identifies the data key generation (a key deleted and re-created under the same name has
    /// another id).
    pub key_id: [u8; 16],
    /// Plaintext bytes per chunk.
    pub chunk_size: u32,
    /// Random nonce prefix of this stream.
    pub nonce_prefix: [u8; PREFIX],
}

impl Header {
    /// A header for a new stream with a fresh random nonce prefix.
    ///
    /// # Errors
    /// [`Error::Internal`] if the system RNG fails; [`Error::InvalidArgument`] for a name over
    /// 255 bytes.
    pub fn new(key_name: &str, key_id: [u8; 16]) -> Result<Self, Error> {
        if key_name.len() > 255 {
            return Err(Error::InvalidArgument("key name too long for the stream header".into()));
        }
        let mut nonce_prefix = [0u8; PREFIX];
        aws_lc_rs::rand::fill(&mut nonce_prefix).map_err(|_| Error::Internal("RNG failure".into()))?;
        Ok(Self { key_name: key_name.into(), key_id, chunk_size: CHUNK as u32, nonce_prefix })
    }

    /// Encodes the header.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 2 + self.key_name.len() + 16 + 4 + PREFIX);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.key_name.len() as u8);
        out.extend_from_slice(self.key_name.as_bytes());
        out.extend_from_slice(&self.key_id);
        out.extend_from_slice(&self.chunk_size.to_be_bytes());
        out.extend_from_slice(&self.nonce_prefix);
        out
    }

    /// Parses a header from the start of `buf`. Returns `Ok(None)` if more bytes are needed,
    /// else the header and its encoded length.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a stream that is not in this format.
    pub fn parse(buf: &[u8]) -> Result<Option<(Self, usize)>, Error> {
        let bad = |m: &str| Error::InvalidArgument(format!("not a tpm-vault encrypted stream: {m}"));
        if buf.len() < 10 {
            if !MAGIC.starts_with(&buf[..buf.len().min(8)]) {
                return Err(bad("bad magic"));
            }
            return Ok(None);
        }
        if &buf[..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        if buf[8] != VERSION {
            return Err(bad(&format!("unsupported version {}", buf[8])));
        }
        let name_len = usize::from(buf[9]);
        let len = 10 + name_len + 16 + 4 + PREFIX;
        if buf.len() < len {
            return Ok(None);
        }
        let key_name = std::str::from_utf8(&buf[10..10 + name_len]).map_err(|_| bad("key name"))?.to_owned();
        let mut key_id = [0u8; 16];
        key_id.copy_from_slice(&buf[10 + name_len..26 + name_len]);
        let mut size = [0u8; 4];
        size.copy_from_slice(&buf[26 + name_len..30 + name_len]);
        let chunk_size = u32::from_be_bytes(size);
        if chunk_size == 0 || chunk_size as usize > 16 * CHUNK {
            return Err(bad("chunk size"));
        }
        let mut nonce_prefix = [0u8; PREFIX];
        nonce_prefix.copy_from_slice(&buf[30 + name_len..len]);
        Ok(Some((Self { key_name, key_id, chunk_size, nonce_prefix }, len)))
    }
}

/// Per-chunk state shared by both directions.
struct Chunker {
    key: LessSafeKey,
    prefix: [u8; PREFIX],
    aad_base: Vec<u8>,
    counter: u32,
}

impl Chunker {
    fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, Error> {
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| Error::Internal("AES key".into()))?);
        let mut aad_base = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &header.encode()).as_ref().to_vec();
        aad_base.extend_from_slice(context);
        Ok(Self { key, prefix: header.nonce_prefix, aad_base, counter: 0 })
    }

    fn nonce(&self, last: bool) -> Nonce {
        let mut n = [0u8; 12];
        n[..PREFIX].copy_from_slice(&self.prefix);
        n[PREFIX..PREFIX + 4].copy_from_slice(&self.counter.to_be_bytes());
        n[11] = u8::from(last);
        Nonce::assume_unique_for_key(n)
    }

    fn advance(&mut self) -> Result<(), Error> {
        self.counter = self.counter.checked_add(1).ok_or_else(|| Error::InvalidArgument("stream too long".into()))?;
        Ok(())
    }

    /// Seals the chunk `first || second` (plaintext) straight into `out`: the plaintext is
    /// copied once, into its place in `out`, and encrypted there.
    fn seal_into(&mut self, first: &[u8], second: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        out.reserve(first.len() + second.len() + TAG);
        out.extend_from_slice(first);
        out.extend_from_slice(second);
        let nonce = self.nonce(last);
        let aad = Aad::from(self.aad_base.as_slice());
        match self.key.seal_in_place_separate_tag(nonce, aad, &mut out[start..]) {
            Ok(tag) => out.extend_from_slice(tag.as_ref()),
            Err(_) => {
                out.truncate(start);
                return Err(Error::Internal("AES-GCM seal".into()));
            }
        }
        self.advance()
    }

    /// Opens the sealed chunk `first || second` (ciphertext and tag) straight into `out`,
    /// which gets its plaintext only if the tag verifies (nothing otherwise).
    fn open_into(&mut self, first: &[u8], second: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        out.extend_from_slice(first);
        out.extend_from_slice(second);
        let nonce = self.nonce(last);
        let aad = Aad::from(self.aad_base.as_slice());
        let index = self.counter;
        match self.key.open_in_place(nonce, aad, &mut out[start..]) {
            Ok(plain) => {
                let len = plain.len();
                out.truncate(start + len);
            }
            Err(_) => {
                // Never release a byte of a chunk that does not authenticate.
                out.truncate(start);
                return Err(Error::InvalidArgument(format!(
                    "chunk {index} does not authenticate (tampered, reordered, truncated, from another stream, \
                     or wrong key or context)"
                )));
            }
        }
        self.advance()
    }
}

/// Encrypts a stream chunk by chunk. Feed plaintext with [`Encryptor::update`]; call
/// [`Encryptor::finish`] once. Output is produced as soon as a chunk is full.
///
/// Plaintext is copied once, into the output, and encrypted in place there; only the tail of
/// an update that does not fill a chunk is held back (in `pending`) for the next one.
pub struct Encryptor {
    chunker: Chunker,
    pending: Vec<u8>,
    chunk_size: usize,
    header: Option<Vec<u8>>,
}

impl std::fmt::Debug for Encryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryptor").field("counter", &self.chunker.counter).finish_non_exhaustive()
    }
}

impl Encryptor {
    /// Starts a stream under `key` with `header`, binding `context` (associated data) into
    /// every chunk.
    ///
    /// # Errors
    /// [`Error::Internal`] if the key is unusable.
    pub fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, Error> {
        Ok(Self {
            chunker: Chunker::new(key, header, context)?,
            pending: Vec::with_capacity(header.chunk_size as usize),
            chunk_size: header.chunk_size as usize,
            header: Some(header.encode()),
        })
    }

    /// The most bytes [`Encryptor::update`] appends for `len` bytes of plaintext.
    pub fn max_output(&self, len: usize) -> usize {
        let header = self.header.as_ref().map_or(0, Vec::len);
        let chunks = (self.pending.len() + len) / self.chunk_size;
        header + chunks * (self.chunk_size + TAG)
    }

    /// Adds plaintext; appends any finished output (header first) to `out`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past 2^32 chunks.
    pub fn update(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        out.reserve(self.max_output(data.len()));
        if let Some(h) = self.header.take() {
            out.extend_from_slice(&h);
        }
        // A full chunk is never the final one (that one is always shorter than chunk_size, and
        // empty when the plaintext ends on a chunk boundary), so it is sealed at once.
        loop {
            let need = self.chunk_size - self.pending.len();
            if data.len() < need {
                self.pending.extend_from_slice(data);
                return Ok(());
            }
            self.chunker.seal_into(&self.pending, &data[..need], false, out)?;
            self.pending.clear();
            data = &data[need..];
        }
    }

    /// Seals the final chunk and appends it to `out`.
    ///
    /// # Errors
    /// As [`Encryptor::update`].
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        if let Some(h) = self.header.take() {
            out.extend_from_slice(&h);
        }
        self.chunker.seal_into(&self.pending, &[], true, out)
    }
}

/// Decrypts a stream chunk by chunk, releasing plaintext only after each chunk's tag verified.
///
/// Ciphertext is copied once, into the output, and opened in place there; only a chunk that
/// is incomplete, or complete with nothing after it yet, is held back (in `buf`).
pub struct Decryptor {
    chunker: Chunker,
    buf: Vec<u8>,
    sealed_chunk: usize,
    done: bool,
}

impl std::fmt::Debug for Decryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decryptor").field("counter", &self.chunker.counter).finish_non_exhaustive()
    }
}

impl Decryptor {
    /// Starts decrypting a stream whose header was parsed already.
    ///
    /// # Errors
    /// [`Error::Internal`] if the key is unusable.
    pub fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, Error> {
        Ok(Self {
            chunker: Chunker::new(key, header, context)?,
            buf: Vec::with_capacity(header.chunk_size as usize + TAG),
            sealed_chunk: header.chunk_size as usize + TAG,
            done: false,
        })
    }

    /// Adds ciphertext (after the header); appends verified plaintext to `out`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the failing chunk (tampered, reordered, spliced, wrong
    /// key or context), or data after the final chunk.
    pub fn update(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        out.reserve((self.buf.len() + data.len()).saturating_sub(1) / self.sealed_chunk * (self.sealed_chunk - TAG));
        while !data.is_empty() {
            if self.done {
                return Err(Error::InvalidArgument("data after the final chunk".into()));
            }
            // A full sealed chunk is opened as non-final only once more data shows it is not
            // the last one.
            let need = self.sealed_chunk - self.buf.len();
            if data.len() <= need {
                self.buf.extend_from_slice(data);
                return Ok(());
            }
            self.chunker.open_into(&self.buf, &data[..need], false, out)?;
            self.buf.clear();
            data = &data[need..];
        }
        Ok(())
    }

    /// Ends the stream: the buffered data must be a valid final chunk.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the stream was truncated or the final chunk fails.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        if self.done {
            return Ok(());
        }
        if self.buf.len() < TAG || self.buf.len() == self.sealed_chunk {
            return Err(Error::InvalidArgument(format!(
                "stream truncated: no final chunk after chunk {}",
                self.chunker.counter
            )));
        }
        self.chunker.open_into(&self.buf, &[], true, out)?;
        self.done = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn encrypt(data: &[u8], ctx: &[u8], piece: usize) -> Vec<u8> {
        let h = Header::new("dk", [1; 16]).unwrap_or_else(|e| panic!("{e}"));
        let mut e = Encryptor::new(&KEY, &h, ctx).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        for c in data.chunks(piece.max(1)) {
            e.update(c, &mut out).unwrap_or_else(|e| panic!("{e}"));
        }
        e.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn decrypt(stream: &[u8], key: &[u8; 32], ctx: &[u8], piece: usize) -> Result<Vec<u8>, Error> {
        let (h, n) = Header::parse(stream)?.ok_or_else(|| Error::InvalidArgument("short".into()))?;
        let mut d = Decryptor::new(key, &h, ctx)?;
        let mut out = Vec::new();
        for c in stream[n..].chunks(piece.max(1)) {
            d.update(c, &mut out)?;
        }
        d.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn round_trips_at_the_edges() {
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for piece in [1000, CHUNK, 7 * CHUNK] {
                let s = encrypt(&data, b"ctx", piece);
                assert_eq!(decrypt(&s, &KEY, b"ctx", 4096).ok(), Some(data.clone()), "len {len} piece {piece}");
            }
        }
    }

    #[test]
    fn output_does_not_depend_on_pieces() {
        let h = Header { key_name: "dk".into(), key_id: [1; 16], chunk_size: CHUNK as u32, nonce_prefix: [3; PREFIX] };
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let mut reference = None;
            for piece in [1, 1000, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 5 * CHUNK] {
                let mut e = Encryptor::new(&KEY, &h, b"c").unwrap_or_else(|e| panic!("{e}"));
                let mut out = Vec::new();
                for c in data.chunks(piece) {
                    let before = out.len();
                    let max = e.max_output(c.len());
                    e.update(c, &mut out).unwrap_or_else(|e| panic!("{e}"));
                    assert!(out.len() - before <= max, "max_output");
                }
                e.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(out.len(), h.encode().len() + len + (len / CHUNK + 1) * TAG);
                match &reference {
                    None => reference = Some(out),
                    Some(r) => assert!(r == &out, "len {len} piece {piece}"),
                }
            }
        }
    }

    #[test]
    fn tampering_is_detected() {
        let data = vec![42u8; 3 * CHUNK + 5];
        let s = encrypt(&data, b"", CHUNK);
        let header_len = Header::parse(&s).ok().flatten().map_or(0, |(_, n)| n);
        let sealed = CHUNK + TAG;
        // Flipped bit in each chunk.
        for i in 0..4 {
            let mut t = s.clone();
            t[header_len + i * sealed + 3] ^= 1;
            assert!(decrypt(&t, &KEY, b"", 4096).is_err(), "chunk {i}");
        }
        // Truncated: final chunk dropped, or stream cut at a chunk boundary.
        assert!(decrypt(&s[..header_len + 3 * sealed], &KEY, b"", 4096).is_err());
        assert!(decrypt(&s[..s.len() - 1], &KEY, b"", 4096).is_err());
        // Reordered chunks.
        let mut r = s.clone();
        let (a, b) = (header_len, header_len + sealed);
        let first = s[a..a + sealed].to_vec();
        r[a..a + sealed].copy_from_slice(&s[b..b + sealed]);
        r[b..b + sealed].copy_from_slice(&first);
        assert!(decrypt(&r, &KEY, b"", 4096).is_err());
        // A chunk from another stream (same key, another prefix).
        let other = encrypt(&data, b"", CHUNK);
        let mut spliced = s.clone();
        spliced[a..a + sealed].copy_from_slice(&other[a..a + sealed]);
        assert!(decrypt(&spliced, &KEY, b"", 4096).is_err());
        // Wrong key, wrong context.
        assert!(decrypt(&s, &[8; 32], b"", 4096).is_err());
        assert!(decrypt(&encrypt(&data, b"tenant-a", CHUNK), &KEY, b"tenant-b", 4096).is_err());
        // Data appended after the final chunk.
        let mut extra = s.clone();
        extra.push(0);
        assert!(decrypt(&extra, &KEY, b"", 4096).is_err());
    }

    #[test]
    fn no_plaintext_is_released_from_the_failing_chunk_on() {
        let data = vec![9u8; 2 * CHUNK + 10];
        let mut s = encrypt(&data, b"", CHUNK);
        let (h, n) = Header::parse(&s).ok().flatten().unwrap_or_else(|| panic!("header"));
        s[n + CHUNK + TAG + 1] ^= 0x80; // second chunk
        let mut d = Decryptor::new(&KEY, &h, b"").unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        let r = d.update(&s[n..], &mut out);
        assert!(r.is_err());
        assert_eq!(out.len(), CHUNK, "only the verified first chunk was released");
    }
}
