//! The two things an `ssh`-usage key may sign, parsed strictly: an SSH user-authentication
//! request (RFC 4252 section 7, with OpenSSH's `publickey-hostbound-v00@openssh.com` variant)
//! and an SSHSIG blob (OpenSSH `PROTOCOL.sshsig`), plus the OpenSSH public key blob of a vault
//! key that a user-authentication request must name.
//!
//! This module owns the byte-level checks only: it reads untrusted bytes (whatever a peer of an
//! SSH agent sent) and hashes nothing; the vault decides what to do with the answer
//! (`Vault::sign` with `SignPurpose::Ssh`). Every length is bounded by the input and checked
//! before use, no field may be left unread, and nothing panics on any input (fuzzed by
//! `fuzz/fuzz_targets/ssh_userauth.rs` and `ssh_sshsig.rs`).

use tpm_vault_proto::algorithm::{Curve, Family, TpmKey};

use crate::model::{HashAlg, KeyAlg, Scheme};

/// `SSH_MSG_USERAUTH_REQUEST`.
const USERAUTH_REQUEST: u8 = 50;
/// The SSHSIG magic preamble (six bytes, no length prefix).
const SSHSIG_MAGIC: &[u8] = b"SSHSIG";
/// Longest user name, namespace or algorithm name accepted (OpenSSH's are far shorter).
const MAX_NAME: usize = 1024;

/// What an SSH signature covers, as parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshSigned<'a> {
    /// An `SSH_MSG_USERAUTH_REQUEST` for public-key authentication, as a client signs it.
    UserAuth(UserAuth<'a>),
    /// An SSHSIG signed-data blob (`ssh-keygen -Y sign`, git's SSH signing).
    Sshsig(Sshsig<'a>),
}

/// A parsed user-authentication request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAuth<'a> {
    /// The session identifier (the first exchange hash): 20, 32, 48 or 64 bytes.
    pub session_id: &'a [u8],
    /// The user name.
    pub user: &'a str,
    /// `publickey` or `publickey-hostbound-v00@openssh.com`.
    pub method: &'a str,
    /// The public key algorithm name (`ecdsa-sha2-nistp256`, `rsa-sha2-512`, a `-cert-v01`
    /// variant, ...).
    pub algorithm: &'a str,
    /// The public key (or certificate) blob.
    pub key_blob: &'a [u8],
    /// The server's host key blob (the host-bound method only).
    pub host_key: Option<&'a [u8]>,
}

/// A parsed SSHSIG blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sshsig<'a> {
    /// The namespace (`file`, `git`, `email@example.com`, ...): never empty.
    pub namespace: &'a str,
    /// The hash of the message: `sha256` or `sha512`.
    pub hash: HashAlg,
    /// H(message), of that hash's length.
    pub message_hash: &'a [u8],
}

/// Why bytes are not an SSH signature's data (INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshDataError {
    /// A field runs past the end of the data.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// Bytes after the last field.
    #[error("{0} bytes after the last field")]
    Trailing(usize),
    /// The session identifier is not the length of an exchange hash.
    #[error("session identifier of {0} bytes (an exchange hash is 20, 32, 48 or 64)")]
    SessionId(usize),
    /// Not `SSH_MSG_USERAUTH_REQUEST`.
    #[error("message type {0} is not SSH_MSG_USERAUTH_REQUEST (50)")]
    MessageType(u8),
    /// A field that must be UTF-8 text is not, is empty or too long.
    #[error("bad {0}")]
    Text(&'static str),
    /// A service other than `ssh-connection`.
    #[error("service is not ssh-connection")]
    Service,
    /// A method other than public-key authentication.
    #[error("method is not publickey")]
    Method,
    /// The "has signature" boolean is not TRUE (1).
    #[error("the signature flag is not TRUE")]
    NoSignatureFlag,
    /// The SSHSIG reserved field is not empty.
    #[error("the SSHSIG reserved field is not empty")]
    Reserved,
    /// An SSHSIG hash other than sha256/sha512, or a hash of another length.
    #[error("SSHSIG hash must be sha256 or sha512 with a digest of its length")]
    SshsigHash,
    /// Neither a user-authentication request nor an SSHSIG blob.
    #[error("neither an SSH user-authentication request nor an SSHSIG blob")]
    Unknown,
    /// The request names a public key algorithm this key cannot sign for.
    #[error("the request's algorithm {0} does not suit this key")]
    Algorithm(String),
    /// The request names a public key (or certificate) that is not this key.
    #[error("the request names another public key")]
    OtherKey,
    /// The requested hash or scheme is not the one the SSH algorithm uses.
    #[error("the SSH algorithm needs {0}")]
    Mismatch(String),
}

/// Parses `data` as a user-authentication request or an SSHSIG blob (told apart by the magic).
///
/// # Errors
/// [`SshDataError`] saying why it is neither.
pub fn parse(data: &[u8]) -> Result<SshSigned<'_>, SshDataError> {
    if data.starts_with(SSHSIG_MAGIC) {
        parse_sshsig(data).map(SshSigned::Sshsig)
    } else if data.len() >= 4 {
        parse_userauth(data).map(SshSigned::UserAuth)
    } else {
        Err(SshDataError::Unknown)
    }
}

/// Parses an SSH user-authentication request's signed data (RFC 4252 section 7).
///
/// # Errors
/// [`SshDataError`].
pub fn parse_userauth(data: &[u8]) -> Result<UserAuth<'_>, SshDataError> {
    let mut r = Reader::new(data);
    let session_id = r.string()?;
    if !matches!(session_id.len(), 20 | 32 | 48 | 64) {
        return Err(SshDataError::SessionId(session_id.len()));
    }
    let kind = r.byte()?;
    if kind != USERAUTH_REQUEST {
        return Err(SshDataError::MessageType(kind));
    }
    let user = r.text("user name")?;
    if r.string()? != b"ssh-connection" {
        return Err(SshDataError::Service);
    }
    let method = r.text("method")?;
    let hostbound = match method {
        "publickey" => false,
        "publickey-hostbound-v00@openssh.com" => true,
        _ => return Err(SshDataError::Method),
    };
    if r.byte()? != 1 {
        return Err(SshDataError::NoSignatureFlag);
    }
    let algorithm = r.text("algorithm name")?;
    let key_blob = r.string()?;
    if key_blob.is_empty() {
        return Err(SshDataError::OtherKey);
    }
    let host_key = if hostbound {
        let blob = r.string()?;
        if blob.is_empty() {
            return Err(SshDataError::Text("host key"));
        }
        Some(blob)
    } else {
        None
    };
    r.finish()?;
    Ok(UserAuth { session_id, user, method, algorithm, key_blob, host_key })
}

/// Parses an SSHSIG signed-data blob (`PROTOCOL.sshsig`: magic, namespace, reserved, hash
/// algorithm, H(message)).
///
/// # Errors
/// [`SshDataError`].
pub fn parse_sshsig(data: &[u8]) -> Result<Sshsig<'_>, SshDataError> {
    let rest = data.strip_prefix(SSHSIG_MAGIC).ok_or(SshDataError::Unknown)?;
    let mut r = Reader { data: rest, pos: 0, base: SSHSIG_MAGIC.len() };
    let namespace = r.text("namespace")?;
    if !r.string()?.is_empty() {
        return Err(SshDataError::Reserved);
    }
    let hash = match r.string()? {
        b"sha256" => HashAlg::Sha256,
        b"sha512" => HashAlg::Sha512,
        _ => return Err(SshDataError::SshsigHash),
    };
    let message_hash = r.string()?;
    if message_hash.len() != hash.digest_len() {
        return Err(SshDataError::SshsigHash);
    }
    r.finish()?;
    Ok(Sshsig { namespace, hash, message_hash })
}

/// The scheme and hash an SSH signature by a key of `alg` over `signed` must use, checked
/// against the request's (`None` = whatever SSH needs), and, for a user-authentication request,
/// that it names this key (`key_blob`: the key's OpenSSH public key blob, [`public_key_blob`]),
/// plainly or inside an OpenSSH certificate.
///
/// # Errors
/// [`SshDataError::Algorithm`], [`SshDataError::OtherKey`], [`SshDataError::Mismatch`].
pub fn signing_plan(
    alg: KeyAlg,
    key_blob: &[u8],
    signed: &SshSigned<'_>,
    scheme: Option<Scheme>,
    hash: Option<HashAlg>,
) -> Result<(Scheme, HashAlg), SshDataError> {
    let info = alg.info();
    let rsa = info.family == Family::Rsa;
    let ecc = info.family == Family::Ecc;
    let (want_scheme, want_hash) = match signed {
        SshSigned::UserAuth(auth) => {
            let plain = auth.algorithm.strip_suffix("-cert-v01@openssh.com");
            let base = plain.unwrap_or(auth.algorithm);
            let plan = match base {
                _ if ecc && info.ssh_key_type == Some(base) => (Scheme::Ecdsa, alg.default_hash()),
                "rsa-sha2-256" if rsa => (Scheme::RsaPkcs1, HashAlg::Sha256),
                "rsa-sha2-512" if rsa => (Scheme::RsaPkcs1, HashAlg::Sha512),
                "ssh-rsa" if rsa => (Scheme::RsaPkcs1, HashAlg::Sha1),
                _ => return Err(SshDataError::Algorithm(auth.algorithm.to_owned())),
            };
            // The key's own blob must be of the key's type: a request can then only name a
            // key whose type matches the algorithm it asks for.
            let mut own_type = Vec::new();
            put_string(&mut own_type, info.ssh_key_type.unwrap_or_default().as_bytes());
            let names_key = key_blob.starts_with(&own_type)
                && if plain.is_some() {
                    certificate_names_key(auth.key_blob, key_blob)
                } else {
                    auth.key_blob == key_blob
                };
            if !names_key {
                return Err(SshDataError::OtherKey);
            }
            plan
        }
        SshSigned::Sshsig(_) => match alg {
            _ if ecc => (Scheme::Ecdsa, alg.default_hash()),
            // ssh-keygen signs with rsa-sha2-512; rsa-sha2-256 is valid too. Never SHA-1.
            _ if rsa => (Scheme::RsaPkcs1, hash.filter(|h| *h == HashAlg::Sha256).unwrap_or(HashAlg::Sha512)),
            other => return Err(SshDataError::Algorithm(other.as_str().to_owned())),
        },
    };
    if scheme.is_some_and(|s| s != want_scheme) || hash.is_some_and(|h| h != want_hash) {
        return Err(SshDataError::Mismatch(format!("scheme {} with {}", want_scheme.as_str(), want_hash.as_str())));
    }
    Ok((want_scheme, want_hash))
}

/// The OpenSSH public key blob (`ecdsa-sha2-nistp256`/`384`, `ssh-rsa`) of a vault key's DER
/// SubjectPublicKeyInfo; `None` for keys without one (or a SubjectPublicKeyInfo that does not
/// parse).
pub fn public_key_blob(alg: KeyAlg, spki_der: &[u8]) -> Option<Vec<u8>> {
    use p256::elliptic_curve::sec1::ToEncodedPoint as _;
    use p256::pkcs8::DecodePublicKey as _;
    let info = alg.info();
    let mut blob = Vec::new();
    put_string(&mut blob, info.ssh_key_type?.as_bytes());
    match info.tpm_key? {
        TpmKey::Ecc(curve) => {
            let point = match curve {
                Curve::NistP256 => {
                    p256::PublicKey::from_public_key_der(spki_der).ok()?.to_encoded_point(false).to_bytes()
                }
                Curve::NistP384 => {
                    p384::PublicKey::from_public_key_der(spki_der).ok()?.to_encoded_point(false).to_bytes()
                }
            };
            put_string(&mut blob, curve.ssh_name().as_bytes());
            put_string(&mut blob, &point);
        }
        TpmKey::Rsa { .. } => {
            use rsa::traits::PublicKeyParts as _;
            let key = rsa::RsaPublicKey::from_public_key_der(spki_der).ok()?;
            put_mpint(&mut blob, &key.e().to_bytes_be());
            put_mpint(&mut blob, &key.n().to_bytes_be());
        }
    }
    Some(blob)
}

/// Whether the OpenSSH certificate `cert` certifies the key whose plain blob is `key_blob`: a
/// certificate is `string type, string nonce`, then the key's fields exactly as the plain blob
/// has them after its own type name (PROTOCOL.certkeys).
fn certificate_names_key(cert: &[u8], key_blob: &[u8]) -> bool {
    let key_fields = || -> Option<&[u8]> {
        let mut r = Reader::new(key_blob);
        r.string().ok()?;
        key_blob.get(r.pos..)
    };
    let cert_fields = || -> Option<&[u8]> {
        let mut r = Reader::new(cert);
        r.string().ok()?;
        r.string().ok()?;
        cert.get(r.pos..)
    };
    match (key_fields(), cert_fields()) {
        (Some(key), Some(cert)) => !key.is_empty() && cert.starts_with(key),
        _ => false,
    }
}

fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// An SSH `mpint` of a non-negative big-endian magnitude (RFC 4251 section 5).
fn put_mpint(out: &mut Vec<u8>, magnitude: &[u8]) {
    let trimmed = match magnitude.iter().position(|&b| b != 0) {
        Some(i) => &magnitude[i..],
        None => &[],
    };
    if trimmed.first().is_some_and(|b| b & 0x80 != 0) {
        out.extend_from_slice(&(trimmed.len() as u32 + 1).to_be_bytes());
        out.push(0);
        out.extend_from_slice(trimmed);
    } else {
        put_string(out, trimmed);
    }
}

/// A cursor over SSH wire data (RFC 4251 section 5); positions in errors count from the start
/// of the whole input.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Bytes before `data` in the input (the SSHSIG magic), for error positions.
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0, base: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SshDataError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or(SshDataError::Truncated(self.base + self.pos))?;
        let bytes = &self.data[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, SshDataError> {
        Ok(self.take(1)?[0])
    }

    fn string(&mut self) -> Result<&'a [u8], SshDataError> {
        let len = self.take(4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        self.take(len)
    }

    /// A non-empty UTF-8 string of at most [`MAX_NAME`] bytes with no control characters.
    fn text(&mut self, what: &'static str) -> Result<&'a str, SshDataError> {
        let bytes = self.string()?;
        let text = std::str::from_utf8(bytes).map_err(|_| SshDataError::Text(what))?;
        if text.is_empty() || text.len() > MAX_NAME || text.chars().any(char::is_control) {
            return Err(SshDataError::Text(what));
        }
        Ok(text)
    }

    fn finish(&self) -> Result<(), SshDataError> {
        match self.data.len() - self.pos {
            0 => Ok(()),
            n => Err(SshDataError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests;
