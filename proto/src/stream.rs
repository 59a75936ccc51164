//! The encrypted stream format (SPEC §7), shared by the daemon (which wraps and unwraps
//! stream keys and runs the `Encrypt`/`Decrypt` RPCs) and the client library (which encrypts and
//! decrypts in the caller's process). README's "Bulk encryption" section has the byte table.
//!
//! ```text
//! header v3 = header v2 with version u8 = 3 (the wrapping's associated data names version 3)
//! stream v3 = header v3 | chunks (as v2) | commitment [32]
//! commitment = HMAC-SHA256(mac key, SHA-256(tag_0 || tag_1 || ... || tag_last))
//! mac key    = HMAC-SHA256(data key, "tpm-vault stream mac key v3" || SHA-256(header) || context)
//! header v2 = magic "TPMVAEAD" | version u8 = 2 | name_len u8 | data key name | key_id [16]
//!             | chunk_size u32 BE | wrap_nonce [12] | wrapped stream key [32 + 16]
//! header v1 = magic "TPMVAEAD" | version u8 = 1 | name_len u8 | data key name | key_id [16]
//!             | chunk_size u32 BE | nonce_prefix [7]
//! chunk i   = AES-256-GCM(chunk key, nonce = prefix [7] || i u32 BE || last u8,
//!                         aad = SHA-256(header) || context, plaintext_i) = ciphertext || tag [16]
//! ```
//! v3 (written from the release that fixed issue #31): v2's chunks, then a commitment only the
//! daemon can make, for a caller allowed to `encrypt` (CommitStream, or the Encrypt RPC), and
//! check, for one allowed to `decrypt` (VerifyStream, or the Decrypt RPC): its key is derived
//! from the data key, which never leaves the daemon, and is never handed out. In v2 the stream
//! key that `OpenStreamKey` gives every decryptor is all it takes to seal chunks, so a client
//! with only `decrypt` could write a new stream under a real header; in v3 such a stream has no
//! valid commitment and fails at its end.
//!
//! v2 (written by releases 0.2 up to v3): each stream has a key of its own, 256 random bits
//! from the daemon's DRBG, wrapped by the data key (AES-256-GCM, a fresh random 96-bit nonce,
//! associated data [`wrap_aad`]: the name, id and chunk size of the header and the context). The
//! chunk key is the stream key and the prefix is zero: a stream key seals one stream only, so
//! its chunk nonces are a plain counter that never repeats. v1 (0.1): the chunk key is the data
//! key itself and the prefix is random per stream, which after ~6,000 streams under one data key
//! passes the 2^-32 collision bound of SP 800-38D; v1 stays readable forever, never written.
//!
//! Every chunk but the last carries exactly `chunk_size` plaintext bytes; the last carries fewer
//! (possibly zero) and has `last = 1`. So truncation (no final chunk), reordering (counter),
//! splicing from another stream (another key, or another prefix and header hash), a wrong key or
//! context (tag) are all detected, and a decryptor never releases a chunk before its tag verified.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

/// Format magic.
pub const MAGIC: &[u8; 8] = b"TPMVAEAD";
/// The version of new streams.
pub const VERSION: u8 = 3;
/// The version of 0.2's streams (no commitment: see the module docs), still read.
pub const VERSION_2: u8 = 2;
/// The version of 0.1's streams, still read.
pub const VERSION_1: u8 = 1;
/// Plaintext bytes per chunk.
pub const CHUNK: usize = 64 * 1024;
/// GCM tag length.
pub const TAG: usize = 16;
/// Length of the nonce prefix of a v1 stream.
pub const PREFIX: usize = 7;
/// A wrapped stream key: the sealed 32 bytes and their tag.
pub const WRAPPED: usize = 32 + TAG;
/// Longest header: a v2 header with a 255-byte key name.
pub const MAX_HEADER: usize = 8 + 1 + 1 + 255 + 16 + 4 + 12 + WRAPPED;
/// Largest chunk size a header may declare.
const MAX_CHUNK: usize = 16 * CHUNK;
/// Domain separator of the stream-key wrapping's associated data.
const WRAP_CONTEXT: &[u8] = b"tpm-vault stream key v2";
/// Bytes of a v3 stream's commitment.
pub const COMMITMENT: usize = 32;
/// Domain separator of a v3 stream's MAC key.
const MAC_KEY_CONTEXT: &[u8] = b"tpm-vault stream mac key v3";

/// Why a stream (or a header) was refused; the message names what and which chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StreamError(pub String);

/// How a stream's chunks are keyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keying {
    /// v2 and v3: a stream key of its own, wrapped by the data key.
    Wrapped {
        /// The wrapping's nonce.
        nonce: [u8; 12],
        /// The sealed stream key and its tag.
        key: [u8; WRAPPED],
        /// v3: the stream ends with a commitment only the daemon makes.
        committed: bool,
    },
    /// v1: the data key itself, with a random nonce prefix.
    DataKey {
        /// The stream's nonce prefix.
        nonce_prefix: [u8; PREFIX],
    },
}

/// A parsed stream header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Data key name.
    pub key_name: String,
    /// The data key's generation (a key deleted and re-created under the same name has another).
    pub key_id: [u8; 16],
    /// Plaintext bytes per chunk.
    pub chunk_size: u32,
    /// How the chunks are keyed (and so the format version).
    pub keying: Keying,
}

impl Header {
    /// The format version.
    pub fn version(&self) -> u8 {
        match self.keying {
            Keying::Wrapped { committed: true, .. } => VERSION,
            Keying::Wrapped { committed: false, .. } => VERSION_2,
            Keying::DataKey { .. } => VERSION_1,
        }
    }

    /// Whether the stream ends with a commitment (v3).
    pub fn is_committed(&self) -> bool {
        matches!(self.keying, Keying::Wrapped { committed: true, .. })
    }

    /// Encodes the header.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_HEADER);
        out.extend_from_slice(MAGIC);
        out.push(self.version());
        out.push(self.key_name.len() as u8);
        out.extend_from_slice(self.key_name.as_bytes());
        out.extend_from_slice(&self.key_id);
        out.extend_from_slice(&self.chunk_size.to_be_bytes());
        match &self.keying {
            Keying::Wrapped { nonce, key, .. } => {
                out.extend_from_slice(nonce);
                out.extend_from_slice(key);
            }
            Keying::DataKey { nonce_prefix } => out.extend_from_slice(nonce_prefix),
        }
        out
    }

    /// Parses a header from the start of `buf`: `Ok(None)` while more bytes are needed, else the
    /// header and its encoded length.
    ///
    /// # Errors
    /// [`StreamError`] for bytes that do not start a stream of a known version.
    pub fn parse(buf: &[u8]) -> Result<Option<(Self, usize)>, StreamError> {
        let bad = |m: &str| StreamError(format!("not a tpm-vault encrypted stream: {m}"));
        if buf.len() < 10 {
            if !MAGIC.starts_with(&buf[..buf.len().min(8)]) {
                return Err(bad("bad magic"));
            }
            return Ok(None);
        }
        if &buf[..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        let version = buf[8];
        let keying_len = match version {
            VERSION | VERSION_2 => 12 + WRAPPED,
            VERSION_1 => PREFIX,
            v => return Err(bad(&format!("unsupported version {v}"))),
        };
        let name_len = usize::from(buf[9]);
        let fixed = 10 + name_len + 16 + 4;
        let len = fixed + keying_len;
        if buf.len() < len {
            return Ok(None);
        }
        let key_name = std::str::from_utf8(&buf[10..10 + name_len]).map_err(|_| bad("key name"))?.to_owned();
        let mut key_id = [0u8; 16];
        key_id.copy_from_slice(&buf[10 + name_len..26 + name_len]);
        let mut size = [0u8; 4];
        size.copy_from_slice(&buf[26 + name_len..fixed]);
        let chunk_size = u32::from_be_bytes(size);
        if chunk_size == 0 || chunk_size as usize > MAX_CHUNK {
            return Err(bad("chunk size"));
        }
        let rest = &buf[fixed..len];
        let keying = if version != VERSION_1 {
            let mut nonce = [0u8; 12];
            let mut key = [0u8; WRAPPED];
            nonce.copy_from_slice(&rest[..12]);
            key.copy_from_slice(&rest[12..]);
            Keying::Wrapped { nonce, key, committed: version == VERSION }
        } else {
            let mut nonce_prefix = [0u8; PREFIX];
            nonce_prefix.copy_from_slice(rest);
            Keying::DataKey { nonce_prefix }
        };
        Ok(Some((Self { key_name, key_id, chunk_size, keying }, len)))
    }

    /// The nonce prefix of the chunks: zero for v2 (a key per stream), random for v1.
    fn prefix(&self) -> [u8; PREFIX] {
        match &self.keying {
            Keying::Wrapped { .. } => [0; PREFIX],
            Keying::DataKey { nonce_prefix } => *nonce_prefix,
        }
    }
}

/// The associated data of a stream key's wrapping: everything in the header but the wrapping
/// itself, and the context, so a wrapped key opens only under its own header and context (and
/// version: a v3 header turned into a v2 one, to drop the commitment, does not open).
pub fn wrap_aad(version: u8, key_name: &str, key_id: &[u8; 16], chunk_size: u32, context: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(WRAP_CONTEXT.len() + 2 + key_name.len() + 20 + context.len());
    aad.extend_from_slice(WRAP_CONTEXT);
    aad.push(version);
    aad.push(key_name.len() as u8);
    aad.extend_from_slice(key_name.as_bytes());
    aad.extend_from_slice(key_id);
    aad.extend_from_slice(&chunk_size.to_be_bytes());
    aad.extend_from_slice(context);
    aad
}

/// An AES-256-GCM key.
fn aes_key(key: &[u8; 32]) -> Result<LessSafeKey, StreamError> {
    Ok(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| StreamError("AES key".into()))?))
}

/// The identity of a stream's data key in its header: name and generation.
#[derive(Debug, Clone, Copy)]
pub struct DataKeyId<'a> {
    /// The data key's name.
    pub name: &'a str,
    /// Its generation id.
    pub id: [u8; 16],
}

/// A v3 header for a new stream of `chunk_size`-byte chunks ([`CHUNK`] for every stream the
/// vault makes): `stream_key` wrapped by `data_key` under `nonce` (which the caller draws fresh
/// from its DRBG for every stream).
///
/// # Errors
/// [`StreamError`] for a key name over 255 bytes or a chunk size out of range.
pub fn wrap(
    data_key: &[u8; 32],
    key: DataKeyId<'_>,
    chunk_size: u32,
    context: &[u8],
    nonce: [u8; 12],
    stream_key: &[u8; 32],
) -> Result<Header, StreamError> {
    wrap_version(data_key, key, chunk_size, context, nonce, stream_key, VERSION)
}

/// [`wrap`] for the format `version` (2 or 3): the daemon makes only v3, tests and fixtures
/// also v2.
///
/// # Errors
/// As [`wrap`]; [`StreamError`] for a version without a stream key.
pub fn wrap_version(
    data_key: &[u8; 32],
    key: DataKeyId<'_>,
    chunk_size: u32,
    context: &[u8],
    nonce: [u8; 12],
    stream_key: &[u8; 32],
    version: u8,
) -> Result<Header, StreamError> {
    let DataKeyId { name: key_name, id: key_id } = key;
    if version != VERSION && version != VERSION_2 {
        return Err(StreamError(format!("a version {version} stream has no stream key")));
    }
    if key_name.len() > 255 {
        return Err(StreamError("key name too long for the stream header".into()));
    }
    if chunk_size == 0 || chunk_size as usize > MAX_CHUNK {
        return Err(StreamError("chunk size out of range".into()));
    }
    let aad = wrap_aad(version, key_name, &key_id, chunk_size, context);
    let mut sealed = stream_key.to_vec();
    let tag = aes_key(data_key)?
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad.as_slice()), &mut sealed)
        .map_err(|_| StreamError("AES-GCM seal".into()))?;
    let mut key = [0u8; WRAPPED];
    key[..32].copy_from_slice(&sealed);
    key[32..].copy_from_slice(tag.as_ref());
    let committed = version == VERSION;
    Ok(Header { key_name: key_name.into(), key_id, chunk_size, keying: Keying::Wrapped { nonce, key, committed } })
}

/// The stream key of a v2 `header`, unwrapped with `data_key`.
///
/// # Errors
/// [`StreamError`] for a v1 header, or a wrapping that does not open (another data key, a
/// wrong context, a tampered header).
pub fn unwrap(
    data_key: &[u8; 32],
    header: &Header,
    context: &[u8],
) -> Result<zeroize::Zeroizing<[u8; 32]>, StreamError> {
    let Keying::Wrapped { nonce, key, .. } = &header.keying else {
        return Err(StreamError("a version 1 stream has no stream key".into()));
    };
    let aad = wrap_aad(header.version(), &header.key_name, &header.key_id, header.chunk_size, context);
    let mut buf = zeroize::Zeroizing::new(key.to_vec());
    let plain = aes_key(data_key)?
        .open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(aad.as_slice()), &mut buf)
        .map_err(|_| {
            StreamError("the stream key does not open: wrong context, a tampered header, or another data key".into())
        })?;
    let mut out = zeroize::Zeroizing::new([0u8; 32]);
    out.copy_from_slice(plain);
    Ok(out)
}

/// The MAC key of the v3 stream with `header` and `context`: derived from the data key, so only
/// the daemon has it, and it never leaves the daemon (decryptors get the stream key only).
///
/// # Errors
/// [`StreamError`] for a header of another version.
pub fn mac_key(
    data_key: &[u8; 32],
    header: &Header,
    context: &[u8],
) -> Result<zeroize::Zeroizing<[u8; 32]>, StreamError> {
    use aws_lc_rs::{digest, hmac};
    if !header.is_committed() {
        return Err(StreamError(format!("a version {} stream has no commitment", header.version())));
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, data_key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(MAC_KEY_CONTEXT);
    ctx.update(digest::digest(&digest::SHA256, &header.encode()).as_ref());
    ctx.update(context);
    let mut out = zeroize::Zeroizing::new([0u8; 32]);
    out.copy_from_slice(ctx.sign().as_ref());
    Ok(out)
}

/// The commitment of a v3 stream whose chunk tags hash to `tags` ([`TagDigest`]), under its
/// [`mac_key`].
pub fn commit(mac_key: &[u8; 32], tags: &[u8; 32]) -> [u8; COMMITMENT] {
    use aws_lc_rs::hmac;
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, mac_key), tags);
    let mut out = [0u8; COMMITMENT];
    out.copy_from_slice(tag.as_ref());
    out
}

/// Checks a v3 stream's commitment (in constant time).
///
/// # Errors
/// [`StreamError`] when it is not the one the daemon made for these chunks.
pub fn verify(mac_key: &[u8; 32], tags: &[u8; 32], commitment: &[u8]) -> Result<(), StreamError> {
    use aws_lc_rs::hmac;
    hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, mac_key), tags, commitment).map_err(|_| {
        StreamError(
            "the stream's commitment does not verify: its chunks were not made through the daemon by a holder of \
             `encrypt` (forged with a stream key, tampered, or truncated)"
                .into(),
        )
    })
}

/// The running SHA-256 of a stream's chunk tags, in order: what a v3 commitment covers.
#[derive(Clone)]
pub struct TagDigest(aws_lc_rs::digest::Context);

impl std::fmt::Debug for TagDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TagDigest")
    }
}

impl Default for TagDigest {
    fn default() -> Self {
        Self(aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256))
    }
}

impl TagDigest {
    /// Adds the next chunk's tag.
    pub fn add(&mut self, tag: &[u8]) {
        self.0.update(tag);
    }

    /// The digest of the tags added.
    pub fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }
}

/// A stream's chunk cipher: seals and opens chunk `i` on its own, so chunks can be processed
/// on several threads (it is `Sync`).
pub struct ChunkCipher {
    /// The chunk key.
    key: LessSafeKey,
    /// The nonce prefix.
    prefix: [u8; PREFIX],
    /// SHA-256(header) || context.
    aad: Vec<u8>,
    /// Plaintext bytes per full chunk.
    chunk_size: usize,
}

impl std::fmt::Debug for ChunkCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCipher").field("chunk_size", &self.chunk_size).finish_non_exhaustive()
    }
}

impl ChunkCipher {
    /// The cipher of the stream with `header` under `key` (the stream key for v2, the data key
    /// for v1), binding `context`.
    ///
    /// # Errors
    /// [`StreamError`] if the key is unusable.
    pub fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, StreamError> {
        let mut aad = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &header.encode()).as_ref().to_vec();
        aad.extend_from_slice(context);
        Ok(Self { key: aes_key(key)?, prefix: header.prefix(), aad, chunk_size: header.chunk_size as usize })
    }

    /// Plaintext bytes per full chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The nonce of chunk `index`.
    fn nonce(&self, index: u32, last: bool) -> Nonce {
        let mut n = [0u8; 12];
        n[..PREFIX].copy_from_slice(&self.prefix);
        n[PREFIX..PREFIX + 4].copy_from_slice(&index.to_be_bytes());
        n[11] = u8::from(last);
        Nonce::assume_unique_for_key(n)
    }

    /// Seals chunk `index` in place: `slot` holds the plaintext followed by [`TAG`] bytes of
    /// room, which receive the tag. Nothing is copied: the batch buffers of the client's
    /// pipeline and the [`Encryptor`]'s output are sealed where they lie.
    ///
    /// # Errors
    /// [`StreamError`] if `slot` is shorter than a tag or the cipher fails.
    pub fn seal(&self, index: u32, last: bool, slot: &mut [u8]) -> Result<(), StreamError> {
        let plain =
            slot.len().checked_sub(TAG).ok_or_else(|| StreamError("chunk slot without room for a tag".into()))?;
        let (data, tag_room) = slot.split_at_mut(plain);
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(index, last), Aad::from(self.aad.as_slice()), data)
            .map_err(|_| StreamError("AES-GCM seal".into()))?;
        tag_room.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens the sealed chunk `index` (ciphertext and tag) in place; returns the length of the
    /// plaintext, which then starts `sealed`. On failure no byte of `sealed` may be released.
    ///
    /// # Errors
    /// [`StreamError`] naming the chunk.
    pub fn open(&self, index: u32, last: bool, sealed: &mut [u8]) -> Result<usize, StreamError> {
        match self.key.open_in_place(self.nonce(index, last), Aad::from(self.aad.as_slice()), sealed) {
            Ok(plain) => Ok(plain.len()),
            Err(_) => Err(StreamError(format!(
                "chunk {index} does not authenticate (tampered, reordered, truncated, from another stream, \
                 or wrong key or context)"
            ))),
        }
    }
}

/// Counts chunks: the next index, refusing to wrap around.
#[derive(Debug, Default)]
struct Counter(u32);

impl Counter {
    /// The current index, then the next one.
    fn next(&mut self) -> Result<u32, StreamError> {
        let i = self.0;
        self.0 = i.checked_add(1).ok_or_else(|| StreamError("stream too long".into()))?;
        Ok(i)
    }
}

/// Encrypts a stream chunk by chunk. Feed plaintext with [`Encryptor::update`]; call
/// [`Encryptor::finish`] once. Output is produced as soon as a chunk is full.
///
/// Plaintext is copied once, into the output, and encrypted in place there; only the tail of
/// an update that does not fill a chunk is held back (in `pending`) for the next one.
#[derive(Debug)]
pub struct Encryptor {
    /// The chunk cipher.
    cipher: ChunkCipher,
    /// The next chunk's index.
    counter: Counter,
    /// Plaintext of the chunk being filled.
    pending: Vec<u8>,
    /// The encoded header, until it is output.
    header: Option<Vec<u8>>,
    /// v3: the digest of the tags so far.
    tags: Option<TagDigest>,
    /// v3: the stream's MAC key ([`Encryptor::with_mac_key`]), for the commitment.
    mac_key: Option<zeroize::Zeroizing<[u8; 32]>>,
}

impl Encryptor {
    /// Starts a stream with `header` under `key`, binding `context` into every chunk.
    ///
    /// # Errors
    /// [`StreamError`] if the key is unusable.
    pub fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, StreamError> {
        let cipher = ChunkCipher::new(key, header, context)?;
        Ok(Self {
            pending: Vec::with_capacity(cipher.chunk_size),
            cipher,
            counter: Counter::default(),
            header: Some(header.encode()),
            tags: header.is_committed().then(TagDigest::default),
            mac_key: None,
        })
    }

    /// This encryptor with the stream's MAC key ([`mac_key`]), which a v3 stream needs to end
    /// with its commitment (the daemon's `Encrypt` RPC).
    pub fn with_mac_key(mut self, mac_key: zeroize::Zeroizing<[u8; 32]>) -> Self {
        self.mac_key = Some(mac_key);
        self
    }

    /// The most bytes [`Encryptor::update`] appends for `len` bytes of plaintext.
    pub fn max_output(&self, len: usize) -> usize {
        let header = self.header.as_ref().map_or(0, Vec::len);
        let chunks = (self.pending.len() + len) / self.cipher.chunk_size;
        header + chunks * (self.cipher.chunk_size + TAG)
    }

    /// Seals `first || second` as the next chunk, appended to `out`.
    fn seal_next(&mut self, second: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let start = out.len();
        out.reserve(self.pending.len() + second.len() + TAG);
        out.extend_from_slice(&self.pending);
        out.extend_from_slice(second);
        out.resize(out.len() + TAG, 0);
        self.pending.clear();
        let index = self.counter.next()?;
        self.cipher.seal(index, last, &mut out[start..]).inspect_err(|_| out.truncate(start))?;
        if let Some(tags) = self.tags.as_mut() {
            tags.add(&out[out.len() - TAG..]);
        }
        Ok(())
    }

    /// Adds plaintext; appends any finished output (header first) to `out`.
    ///
    /// # Errors
    /// [`StreamError`] past 2^32 chunks.
    pub fn update(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        out.reserve(self.max_output(data.len()));
        if let Some(h) = self.header.take() {
            out.extend_from_slice(&h);
        }
        // A full chunk is never the final one (that one is always shorter than chunk_size, and
        // empty when the plaintext ends on a chunk boundary), so it is sealed at once.
        loop {
            let need = self.cipher.chunk_size - self.pending.len();
            if data.len() < need {
                self.pending.extend_from_slice(data);
                return Ok(());
            }
            self.seal_next(&data[..need], false, out)?;
            data = &data[need..];
        }
    }

    /// Seals the final chunk and appends it to `out`.
    ///
    /// # Errors
    /// As [`Encryptor::update`].
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if let Some(h) = self.header.take() {
            out.extend_from_slice(&h);
        }
        self.seal_next(&[], true, out)?;
        if let Some(tags) = self.tags.take() {
            let key =
                self.mac_key.as_ref().ok_or_else(|| StreamError("no MAC key for the stream's commitment".into()))?;
            out.extend_from_slice(&commit(key, &tags.finish()));
        }
        Ok(())
    }
}

/// Decrypts a stream chunk by chunk, releasing plaintext only after each chunk's tag verified.
///
/// Ciphertext is copied once, into the output, and opened in place there; only a chunk that
/// is incomplete, or complete with nothing after it yet, is held back (in `buf`).
#[derive(Debug)]
pub struct Decryptor {
    /// The chunk cipher.
    cipher: ChunkCipher,
    /// The next chunk's index.
    counter: Counter,
    /// Sealed bytes of the chunk being gathered.
    buf: Vec<u8>,
    /// Bytes of a full sealed chunk.
    sealed_chunk: usize,
    /// Whether the final chunk was opened.
    done: bool,
    /// Bytes at the end of the stream that are not chunks: the commitment (v3), else 0.
    holdback: usize,
    /// v3: the digest of the tags so far.
    tags: Option<TagDigest>,
    /// v3: the stream's MAC key, to check the commitment ([`Decryptor::with_mac_key`]).
    mac_key: Option<zeroize::Zeroizing<[u8; 32]>>,
}

impl Decryptor {
    /// Starts decrypting a stream whose header was parsed already, under `key` (the stream
    /// key for v2, the data key for v1).
    ///
    /// # Errors
    /// [`StreamError`] if the key is unusable.
    pub fn new(key: &[u8; 32], header: &Header, context: &[u8]) -> Result<Self, StreamError> {
        let cipher = ChunkCipher::new(key, header, context)?;
        let sealed_chunk = cipher.chunk_size + TAG;
        Ok(Self {
            cipher,
            counter: Counter::default(),
            buf: Vec::with_capacity(sealed_chunk),
            sealed_chunk,
            done: false,
            holdback: if header.is_committed() { COMMITMENT } else { 0 },
            tags: header.is_committed().then(TagDigest::default),
            mac_key: None,
        })
    }

    /// This decryptor with the stream's MAC key ([`mac_key`]): a v3 stream's commitment is
    /// checked at its end (the daemon's `Decrypt` RPC).
    pub fn with_mac_key(mut self, mac_key: zeroize::Zeroizing<[u8; 32]>) -> Self {
        self.mac_key = Some(mac_key);
        self
    }

    /// Opens `sealed` (a whole sealed chunk) as the next chunk, appending its plaintext.
    fn open_chunk(&mut self, sealed: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let start = out.len();
        out.extend_from_slice(sealed);
        let index = self.counter.next()?;
        let plain = self.cipher.open(index, last, &mut out[start..]).inspect_err(|_| out.truncate(start))?;
        out.truncate(start + plain);
        if let Some(tags) = self.tags.as_mut() {
            tags.add(&sealed[sealed.len().saturating_sub(TAG)..]);
        }
        Ok(())
    }

    /// Opens `buf || second` as the next chunk, appending its plaintext to `out`.
    fn open_next(&mut self, second: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let start = out.len();
        out.extend_from_slice(&self.buf);
        out.extend_from_slice(second);
        self.buf.clear();
        let index = self.counter.next()?;
        // Never release a byte of a chunk that does not authenticate.
        let plain = self.cipher.open(index, last, &mut out[start..]).inspect_err(|_| out.truncate(start))?;
        out.truncate(start + plain);
        Ok(())
    }

    /// Adds ciphertext (after the header); appends verified plaintext to `out`.
    ///
    /// # Errors
    /// [`StreamError`] naming the failing chunk (tampered, reordered, spliced, wrong key or
    /// context), or data after the final chunk.
    pub fn update(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.holdback > 0 {
            return self.update_held(data, out);
        }
        out.reserve((self.buf.len() + data.len()).saturating_sub(1) / self.sealed_chunk * (self.sealed_chunk - TAG));
        while !data.is_empty() {
            if self.done {
                return Err(StreamError("data after the final chunk".into()));
            }
            // A full sealed chunk is opened as non-final only once more data shows it is not
            // the last one.
            let need = self.sealed_chunk - self.buf.len();
            if data.len() <= need {
                self.buf.extend_from_slice(data);
                return Ok(());
            }
            self.open_next(&data[..need], false, out)?;
            data = &data[need..];
        }
        Ok(())
    }

    /// [`Decryptor::update`] for a stream that ends with bytes that are not chunks (v3): a
    /// chunk is opened once more than a chunk and the commitment follow it.
    fn update_held(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.done && !data.is_empty() {
            return Err(StreamError("data after the final chunk".into()));
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        let buf = std::mem::take(&mut self.buf);
        let mut result = Ok(());
        while buf.len() - at > self.sealed_chunk + self.holdback {
            result = self.open_chunk(&buf[at..at + self.sealed_chunk], false, out);
            if result.is_err() {
                break;
            }
            at += self.sealed_chunk;
        }
        self.buf = buf;
        self.buf.drain(..at);
        result
    }

    /// Ends the stream: the buffered data must be a valid final chunk.
    ///
    /// # Errors
    /// [`StreamError`] if the stream was truncated or the final chunk fails.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.done {
            return Ok(());
        }
        let chunks = self.buf.len().saturating_sub(self.holdback);
        if self.buf.len() < TAG + self.holdback || chunks == self.sealed_chunk {
            return Err(StreamError(format!("stream truncated: no final chunk after chunk {}", self.counter.0)));
        }
        if self.holdback == 0 {
            self.open_next(&[], true, out)?;
            self.done = true;
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        let (last, commitment) = buf.split_at(chunks);
        self.open_chunk(last, true, out)?;
        self.done = true;
        let tags = self.tags.take().unwrap_or_default().finish();
        match self.mac_key.as_ref() {
            Some(key) => verify(key, &tags, commitment),
            None => Err(StreamError("no MAC key to check the stream's commitment".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA_KEY: [u8; 32] = [7; 32];

    /// A v2 header and its stream key, as the daemon makes them.
    fn v2(ctx: &[u8], nonce: u8) -> (Header, [u8; 32]) {
        let stream_key = [nonce.wrapping_mul(31).wrapping_add(1); 32];
        let key = DataKeyId { name: "dk", id: [1; 16] };
        let h = wrap(&DATA_KEY, key, CHUNK as u32, ctx, [nonce; 12], &stream_key).unwrap_or_else(|e| panic!("{e}"));
        (h, stream_key)
    }

    fn encrypt_with(key: &[u8; 32], h: &Header, data: &[u8], ctx: &[u8], piece: usize) -> Vec<u8> {
        let mut e = Encryptor::new(key, h, ctx).unwrap_or_else(|e| panic!("{e}"));
        if h.is_committed() {
            e = e.with_mac_key(mac_key(&DATA_KEY, h, ctx).unwrap_or_else(|e| panic!("{e}")));
        }
        let mut out = Vec::new();
        for c in data.chunks(piece.max(1)) {
            e.update(c, &mut out).unwrap_or_else(|e| panic!("{e}"));
        }
        e.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn encrypt(data: &[u8], ctx: &[u8], piece: usize) -> Vec<u8> {
        let (h, k) = v2(ctx, 1);
        encrypt_with(&k, &h, data, ctx, piece)
    }

    /// Decrypts as a client does: parse, unwrap with the data key, open the chunks.
    fn decrypt(stream: &[u8], data_key: &[u8; 32], ctx: &[u8], piece: usize) -> Result<Vec<u8>, StreamError> {
        let (h, n) = Header::parse(stream)?.ok_or_else(|| StreamError("short".into()))?;
        let key = match h.keying {
            Keying::Wrapped { .. } => *unwrap(data_key, &h, ctx)?,
            Keying::DataKey { .. } => *data_key,
        };
        let mut d = Decryptor::new(&key, &h, ctx)?;
        if h.is_committed() {
            d = d.with_mac_key(mac_key(data_key, &h, ctx)?);
        }
        let mut out = Vec::new();
        for c in stream[n..].chunks(piece.max(1)) {
            d.update(c, &mut out)?;
        }
        d.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn round_trips_at_the_edges_in_both_versions() {
        let v1 = Header {
            key_name: "dk".into(),
            key_id: [1; 16],
            chunk_size: CHUNK as u32,
            keying: Keying::DataKey { nonce_prefix: [3; PREFIX] },
        };
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for piece in [1000, CHUNK, 7 * CHUNK] {
                let s = encrypt(&data, b"ctx", piece);
                assert_eq!(s[8], VERSION);
                assert_eq!(decrypt(&s, &DATA_KEY, b"ctx", 4096).ok(), Some(data.clone()), "v2 len {len} piece {piece}");
                let s1 = encrypt_with(&DATA_KEY, &v1, &data, b"ctx", piece);
                assert_eq!(
                    decrypt(&s1, &DATA_KEY, b"ctx", 4096).ok(),
                    Some(data.clone()),
                    "v1 len {len} piece {piece}"
                );
            }
        }
    }

    #[test]
    fn headers_round_trip_and_refuse_garbage() {
        let (h, _) = v2(b"", 9);
        let bytes = h.encode();
        assert_eq!(Header::parse(&bytes), Ok(Some((h.clone(), bytes.len()))));
        assert_eq!(Header::parse(&bytes[..bytes.len() - 1]), Ok(None));
        let mut v4 = bytes.clone();
        v4[8] = 4;
        assert!(Header::parse(&v4).is_err());
        assert!(Header::parse(b"NOTVAEAD..").is_err());
    }

    #[test]
    fn output_does_not_depend_on_pieces() {
        let (h, k) = v2(b"c", 3);
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let mut reference = None;
            for piece in [1, 1000, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 5 * CHUNK] {
                let mut e = Encryptor::new(&k, &h, b"c")
                    .unwrap_or_else(|e| panic!("{e}"))
                    .with_mac_key(mac_key(&DATA_KEY, &h, b"c").unwrap_or_else(|e| panic!("{e}")));
                let mut out = Vec::new();
                for c in data.chunks(piece) {
                    let before = out.len();
                    let max = e.max_output(c.len());
                    e.update(c, &mut out).unwrap_or_else(|e| panic!("{e}"));
                    assert!(out.len() - before <= max, "max_output");
                }
                e.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(out.len(), h.encode().len() + len + (len / CHUNK + 1) * TAG + COMMITMENT);
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
        // Flipped bit in each chunk, and in every header byte (the wrapping, or the header hash).
        for i in 0..4 {
            let mut t = s.clone();
            t[header_len + i * sealed + 3] ^= 1;
            assert!(decrypt(&t, &DATA_KEY, b"", 4096).is_err(), "chunk {i}");
        }
        for i in 10..header_len {
            let mut t = s.clone();
            t[i] ^= 1;
            assert!(decrypt(&t, &DATA_KEY, b"", 4096).is_err(), "header byte {i}");
        }
        // Truncated: final chunk dropped, or stream cut at a chunk boundary.
        assert!(decrypt(&s[..header_len + 3 * sealed], &DATA_KEY, b"", 4096).is_err());
        assert!(decrypt(&s[..s.len() - 1], &DATA_KEY, b"", 4096).is_err());
        // Reordered chunks.
        let mut r = s.clone();
        let (a, b) = (header_len, header_len + sealed);
        let first = s[a..a + sealed].to_vec();
        r[a..a + sealed].copy_from_slice(&s[b..b + sealed]);
        r[b..b + sealed].copy_from_slice(&first);
        assert!(decrypt(&r, &DATA_KEY, b"", 4096).is_err());
        // A chunk from another stream under the same data key (another stream key).
        let (h2, k2) = v2(b"", 2);
        let other = encrypt_with(&k2, &h2, &data, b"", CHUNK);
        let mut spliced = s.clone();
        spliced[a..a + sealed].copy_from_slice(&other[a..a + sealed]);
        assert!(decrypt(&spliced, &DATA_KEY, b"", 4096).is_err());
        // Another stream's header on this stream's chunks.
        let mut swapped = other[..header_len].to_vec();
        swapped.extend_from_slice(&s[header_len..]);
        assert!(decrypt(&swapped, &DATA_KEY, b"", 4096).is_err());
        // Wrong data key, wrong context.
        assert!(decrypt(&s, &[8; 32], b"", 4096).is_err());
        let e = decrypt(&encrypt(&data, b"tenant-a", CHUNK), &DATA_KEY, b"tenant-b", 4096);
        assert!(e.is_err_and(|e| e.0.contains("wrong context")));
        // Data appended after the final chunk.
        let mut extra = s.clone();
        extra.push(0);
        assert!(decrypt(&extra, &DATA_KEY, b"", 4096).is_err());
    }

    #[test]
    fn no_plaintext_is_released_from_the_failing_chunk_on() {
        let data = vec![9u8; 2 * CHUNK + 10];
        let (h, k) = v2(b"", 4);
        let mut s = encrypt_with(&k, &h, &data, b"", CHUNK);
        let n = h.encode().len();
        s[n + CHUNK + TAG + 1] ^= 0x80; // second chunk
        let mut d = Decryptor::new(&k, &h, b"").unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        let r = d.update(&s[n..], &mut out);
        assert!(r.is_err_and(|e| e.0.starts_with("chunk 1 ")));
        assert_eq!(out.len(), CHUNK, "only the verified first chunk was released");
    }

    #[test]
    fn chunks_seal_alike_one_by_one_and_through_the_encryptor() {
        let (h, k) = v2(b"x", 5);
        let data = vec![1u8; 2 * CHUNK + 3];
        let whole = encrypt_with(&k, &h, &data, b"x", CHUNK);
        let cipher = ChunkCipher::new(&k, &h, b"x").unwrap_or_else(|e| panic!("{e}"));
        let mut out = h.encode();
        for (i, chunk) in data.chunks(CHUNK).enumerate() {
            let start = out.len();
            out.extend_from_slice(chunk);
            out.resize(out.len() + TAG, 0);
            cipher.seal(i as u32, chunk.len() < CHUNK, &mut out[start..]).unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(out == whole[..whole.len() - COMMITMENT], "the same chunks, then the commitment");
    }

    /// Issue #31, item 5: a holder of the stream key alone (what OpenStreamKey gives a client
    /// with only `decrypt`) seals new chunks under a real header. A v2 stream made so decrypts as
    /// authentic; a v3 one fails at its commitment, whatever commitment it carries; and a v3
    /// header relabelled v2 (to drop the commitment) no longer opens its stream key.
    #[test]
    fn a_stream_key_alone_cannot_forge_a_v3_stream() {
        let forged_plain = b"forged by a decryptor".to_vec();
        for version in [VERSION_2, VERSION] {
            let stream_key = [5u8; 32];
            let key = DataKeyId { name: "dk", id: [1; 16] };
            let h = wrap_version(&DATA_KEY, key, CHUNK as u32, b"", [6; 12], &stream_key, version)
                .unwrap_or_else(|e| panic!("{e}"));
            let real = encrypt_with(&stream_key, &h, b"the real data", b"", CHUNK);
            // The forger: the real header, new chunks sealed with the stream key, and (v3) the
            // real stream's commitment or a made-up one.
            let cipher = ChunkCipher::new(&stream_key, &h, b"").unwrap_or_else(|e| panic!("{e}"));
            let mut forged = h.encode();
            let start = forged.len();
            forged.extend_from_slice(&forged_plain);
            forged.resize(forged.len() + TAG, 0);
            cipher.seal(0, true, &mut forged[start..]).unwrap_or_else(|e| panic!("{e}"));
            if version == VERSION {
                for commitment in [real[real.len() - COMMITMENT..].to_vec(), vec![0; COMMITMENT]] {
                    let mut f = forged.clone();
                    f.extend_from_slice(&commitment);
                    let e = decrypt(&f, &DATA_KEY, b"", 4096).expect_err("a forged v3 stream decrypted");
                    assert!(e.0.contains("commitment does not verify"), "{e}");
                }
                let mut downgraded = real.clone();
                downgraded[8] = VERSION_2;
                downgraded.truncate(downgraded.len() - COMMITMENT);
                assert!(decrypt(&downgraded, &DATA_KEY, b"", 4096).is_err(), "v3 relabelled v2 decrypted");
            } else {
                assert_eq!(decrypt(&forged, &DATA_KEY, b"", 4096).ok(), Some(forged_plain.clone()), "v2 is forgeable");
            }
        }
    }
}
