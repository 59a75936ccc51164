//! The daemon's error type: every layer's error folds into [`Error`]; `rpc/error_status.rs` is the
//! only place that turns it into a gRPC status.

use crate::auth::denied::Denied;
use crate::model::KeyName;
use crate::store::error::StoreError;
use crate::tpm::TpmError;

/// Anything that can go wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: bad name, wrong digest length, unsupported scheme, oversize
    /// input. The message names the field and the rule.
    #[error(transparent)]
    InvalidArgument(#[from] Invalid),
    /// No key with this name.
    #[error("key {:?} not found", .0.as_str())]
    KeyNotFound(KeyName),
    /// The key exists but carries no certificate chain (GetCertificate, the TLS listener).
    #[error("key {:?} has no certificate", .0.as_str())]
    NoCertificate(KeyName),
    /// A record with this name already exists (a signing key, sealed secret or data key: the
    /// store's [`StoreError::Exists`] becomes this).
    #[error("key {:?} already exists", .0.as_str())]
    KeyExists(KeyName),
    /// The access policy denies the operation (also when a write's re-check under the store's
    /// lock refuses it: [`StoreError::Refused`] becomes this).
    #[error("{0}")]
    PermissionDenied(Box<Denied>),
    /// The device has no measured-boot event log (none configured, or no file at its path).
    #[error("{0}")]
    NoEventLog(String),
    /// The event log exists but cannot be read (permissions, I/O, too large).
    #[error("{0}")]
    EventLogUnreadable(String),
    /// The key's PCR policy is not satisfied (PCR values differ from the bound ones).
    #[error("{0}")]
    PcrMismatch(String),
    /// Too many wrong passwords for a key: the dictionary-attack guard refuses further attempts
    /// without trying them on the TPM until `wait` has passed (see [`crate::vault::lockout`]).
    #[error(
        "too many wrong passwords for key {key} (dictionary-attack guard): further attempts are refused for {}",
        wait_text(*.wait)
    )]
    Throttled {
        /// The key.
        key: KeyName,
        /// How long until the next attempt is let through.
        wait: std::time::Duration,
    },
    /// The client is at one of its own bounds (calls in flight, response bytes not yet sent,
    /// key generations): the message names which; retry later.
    #[error(transparent)]
    ClientBusy(Busy),
    /// The TPM failed or is unreachable.
    #[error(transparent)]
    Tpm(#[from] TpmError),
    /// The state directory failed.
    #[error(transparent)]
    Store(StoreError),
    /// A bug or an impossible state; details are logged, not returned.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Denied> for Error {
    fn from(d: Denied) -> Self {
        Self::PermissionDenied(Box::new(d))
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Exists(name) => Self::KeyExists(name),
            StoreError::Refused { name } => Self::from(Denied::ChangedUnderWriteLock(name)),
            other => Self::Store(other),
        }
    }
}

impl Error {
    /// `KeyNotFound` for a name.
    pub fn not_found(name: &KeyName) -> Self {
        Self::KeyNotFound(name.clone())
    }

    /// `InvalidArgument` of a kind without a variant of its own ([`Invalid::Other`]).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument(Invalid::Other(message.into()))
    }
}

/// A wait as a person reads it, rounded up: tenths of a second under 10 s, whole seconds above.
fn wait_text(wait: std::time::Duration) -> String {
    let ms = wait.as_millis();
    if ms < 10_000 {
        let tenths = ms.div_ceil(100).max(1);
        format!("{}.{} s", tenths / 10, tenths % 10)
    } else {
        format!("{} s", ms.div_ceil(1000))
    }
}

impl From<crate::model::InvalidInput> for Error {
    fn from(e: crate::model::InvalidInput) -> Self {
        Self::InvalidArgument(Invalid::Input(e))
    }
}

/// Why a request is malformed ([`Error::InvalidArgument`]), by kind; each message names the
/// field and the rule, as the peer sees it.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// A domain value that does not parse: a key name, an algorithm, a PCR bank or index, ...
    /// ([`crate::model`]).
    #[error(transparent)]
    Input(#[from] crate::model::InvalidInput),
    /// A proto enum field holds a number this daemon does not know.
    #[error("unknown {what} {value}")]
    Unknown {
        /// The field, as the message names it (`key algorithm`, `hash algorithm`, ...).
        what: &'static str,
        /// The number received.
        value: i32,
    },
    /// A PCR binding or selection that cannot be used.
    #[error(transparent)]
    Pcr(#[from] PcrArg),
    /// An attestation nonce of the wrong size.
    #[error("nonce must be 1 to {max} bytes, got {got}")]
    Nonce {
        /// The largest nonce accepted.
        max: usize,
        /// The size received.
        got: usize,
    },
    /// An encrypted stream (Encrypt, Decrypt and their per-chunk RPCs) that cannot be used.
    #[error(transparent)]
    Stream(#[from] StreamArg),
    /// A certificate subject or its alternative names.
    #[error(transparent)]
    Subject(#[from] SubjectArg),
    /// A certificate chain to store with a key.
    #[error(transparent)]
    Chain(#[from] ChainArg),
    /// A signed PCR policy that does not check out.
    #[error("signed policy: {0}")]
    SignedPolicy(String),
    /// Any other rule, named by its message.
    #[error("{0}")]
    Other(String),
}

/// A PCR binding that cannot be used ([`Invalid::Pcr`]).
#[derive(Debug, thiserror::Error)]
pub enum PcrArg {
    /// The same PCR index is listed twice.
    #[error("PCR {0} is listed twice")]
    ListedTwice(u32),
    /// Not one value per selected PCR.
    #[error("{values} PCR values given for {pcrs} PCRs")]
    ValueCount {
        /// Values given.
        values: usize,
        /// PCRs selected.
        pcrs: usize,
    },
    /// A value is not the bank's digest length.
    #[error("{bank} PCR values are {len} bytes")]
    ValueLength {
        /// The bank's name.
        bank: &'static str,
        /// Its digest length.
        len: usize,
    },
    /// Values given where only a selection is taken (Quote, ReadPcrs).
    #[error("PCR values are not accepted here")]
    ValuesNotAccepted,
    /// SignPcrPolicy without a PCR binding.
    #[error("pcrs with values are required")]
    BindingRequired,
    /// SignPcrPolicy with a binding but no values.
    #[error("PCR values to approve are required")]
    ValuesRequired,
}

/// An encrypted stream that cannot be used ([`Invalid::Stream`]).
#[derive(Debug, thiserror::Error)]
pub enum StreamArg {
    /// Encrypt's first message is missing.
    #[error("empty stream: the first message must name the data key")]
    Empty,
    /// Decrypt's input ended before the header was whole.
    #[error("stream truncated: it ended before the tpm-vault stream header")]
    Truncated,
    /// No header parsed within the bound.
    #[error("not a tpm-vault encrypted stream: header too long")]
    HeaderTooLong,
    /// The per-chunk RPCs' header field is not exactly one header.
    #[error("not one whole tpm-vault stream header")]
    NotOneHeader,
    /// The header names another data key than the request.
    #[error("the header names data key {named:?}, not {name}")]
    OtherKey {
        /// The key the header names.
        named: String,
        /// The key the request names.
        name: KeyName,
    },
    /// A version 1 stream given to a per-chunk RPC.
    #[error("a version 1 stream has no stream key: decrypt it with the Decrypt RPC")]
    NoStreamKey,
    /// A stream without a commitment given where one is needed.
    #[error("a version {0} stream has no commitment")]
    NoCommitment(u8),
    /// The tag digest is not 32 bytes.
    #[error("the tag digest is SHA-256: 32 bytes")]
    TagDigest,
    /// The client's request stream failed (its status message).
    #[error("request stream failed: {0}")]
    RequestStream(String),
}

/// A certificate subject that cannot be used ([`Invalid::Subject`]); names and values are
/// shortened before they are quoted.
#[derive(Debug, thiserror::Error)]
pub enum SubjectArg {
    /// No subject given.
    #[error("a subject is required, e.g. CN=device-1,O=Example")]
    Required,
    /// An attribute without `=`.
    #[error("subject attribute {0:?} is not KEY=VALUE (e.g. CN=device-1,O=Example)")]
    NotKeyValue(String),
    /// An attribute type this daemon does not write.
    #[error("unsupported subject attribute {0:?} (expected CN, O, OU, C, ST or L)")]
    Unsupported(String),
    /// The same attribute twice.
    #[error("subject attribute {0} given twice")]
    Twice(String),
    /// An attribute value empty, too long or with control characters.
    #[error("subject attribute {key} must be 1 to {max} printable characters")]
    Value {
        /// The attribute.
        key: String,
        /// Its longest value, in characters.
        max: usize,
    },
    /// C is not two letters.
    #[error("subject attribute C must be a two-letter country code")]
    Country,
    /// A DNS name that is not one.
    #[error("invalid DNS name {0:?}")]
    Dns(String),
    /// An IP address that does not parse.
    #[error("invalid IP address {0:?}")]
    Ip(String),
    /// A URI that is not one.
    #[error("invalid URI {0:?}")]
    Uri(String),
    /// Too many alternative names.
    #[error("more than {0} subject alternative names")]
    TooManyNames(usize),
    /// A name that must be ASCII is not.
    #[error("{0:?} is not ASCII")]
    NotAscii(String),
}

/// A certificate chain that cannot be stored with a key ([`Invalid::Chain`]).
#[derive(Debug, thiserror::Error)]
pub enum ChainArg {
    /// The PEM is larger than the bound.
    #[error("certificate chain larger than {0} bytes")]
    TooLarge(usize),
    /// More certificates than the bound.
    #[error("more than {0} certificates in the chain")]
    TooMany(usize),
    /// No certificate in the PEM.
    #[error("no certificate in the PEM")]
    Empty,
    /// No `CERTIFICATE` block in the PEM.
    #[error("no PEM CERTIFICATE block found")]
    NoBlock,
    /// A PEM block of another kind.
    #[error("PEM block {0:?} is not a CERTIFICATE")]
    NotCertificate(String),
    /// The PEM does not decode.
    #[error("certificate chain is not valid PEM: {0}")]
    Pem(String),
    /// A certificate (numbered from 1) does not parse.
    #[error("certificate {n} is not valid X.509: {why}")]
    X509 {
        /// Its place in the chain, from 1.
        n: usize,
        /// The parser's message.
        why: String,
    },
    /// The leaf's public key is not the key's.
    #[error(
        "the first certificate's public key is not this key's: the chain must start with the key's own certificate"
    )]
    NotThisKey,
    /// A certificate not issued by the next one.
    #[error("certificate {cert} was not issued by certificate {issuer}: give the chain leaf first, then each issuer")]
    NotIssuedBy {
        /// The certificate, from 1.
        cert: usize,
        /// The one that should have issued it.
        issuer: usize,
    },
}

/// Which of its own bounds a client is at ([`Error::ClientBusy`]).
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    /// Its calls in flight that need no TPM.
    #[error("too many requests in flight from this client (at most {0} at once); retry later")]
    Calls(usize),
    /// Its previous RSA key creation still runs.
    #[error("this client's earlier RSA key creation is still running (one at a time); retry later")]
    KeygenRunning,
    /// Its quota of RSA key creations is spent.
    #[error(
        "RSA key creation quota spent: at most {per_minute} RSA key creations per minute per client (bursts of {burst}); retry in {retry_s} s"
    )]
    KeygenQuota {
        /// Creations per minute.
        per_minute: u32,
        /// Burst size.
        burst: u32,
        /// Seconds until the next creation is let through.
        retry_s: u64,
    },
    /// Its response bytes not yet read by it.
    #[error("this client has {0} bytes of responses it has not read yet; read them, then retry")]
    ResponseBytes(usize),
}
