//! The operations of the access policies: one vocabulary for the daemon's policy files, the
//! `CheckAccess` RPC and the client's CLI (`policies/README.md` lists the RPCs each covers).

use std::fmt;
use std::str::FromStr;

/// An operation a policy rule can grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Create keys, sealed secrets' keys and data keys (CreateKey, CreateDataKey,
    /// SetCertificate, CreateSelfSignedCertificate, SetKeyUsage).
    Create,
    /// Sign with a key, and approve PCR policies with it (Sign, CreateCsr, SignPolicy).
    Sign,
    /// Read public keys and metadata, list keys, verify (GetKey, GetPublicKey, Verify,
    /// ListKeys, GetCertificate).
    Public,
    /// Delete keys and data keys (DeleteKey, DeleteDataKey).
    Delete,
    /// Quote PCRs, read PCRs, use the attestation key (Quote, ReadPcrs, GetAttestationKey,
    /// ActivateCredential, CertifySrk, CertifyAttestationKey, GetEventLog).
    Quote,
    /// Seal secrets, import secrets sealed elsewhere and delete sealed secrets (Seal,
    /// ImportSealed, DeleteSealed).
    Seal,
    /// Unseal secrets (Unseal).
    Unseal,
    /// Encrypt with a data key (Encrypt).
    Encrypt,
    /// Decrypt with a data key or an ML-KEM key (Decrypt, Decapsulate).
    Decrypt,
    /// Random bytes (GetRandom).
    Random,
    /// Daemon status, metrics and policy checks (GetStatus, CheckAccess).
    Admin,
}

impl Operation {
    /// Every operation, in documentation order (`operations = ["*"]` grants them all).
    pub const ALL: [Operation; 11] = [
        Self::Create,
        Self::Sign,
        Self::Public,
        Self::Delete,
        Self::Quote,
        Self::Seal,
        Self::Unseal,
        Self::Encrypt,
        Self::Decrypt,
        Self::Random,
        Self::Admin,
    ];

    /// Every operation with its name, in the order of [`Operation::ALL`].
    pub const NAMED: [(&'static str, Operation); 11] = {
        let mut named = [("", Self::Create); 11];
        let mut i = 0;
        while i < Self::ALL.len() {
            named[i] = (Self::ALL[i].as_str(), Self::ALL[i]);
            i += 1;
        }
        named
    };

    /// The name policy files and the CLI use: lower case, e.g. `"sign"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Sign => "sign",
            Self::Public => "public",
            Self::Delete => "delete",
            Self::Quote => "quote",
            Self::Seal => "seal",
            Self::Unseal => "unseal",
            Self::Encrypt => "encrypt",
            Self::Decrypt => "decrypt",
            Self::Random => "random",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an [`Operation`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownOperation(String);

/// Most bytes of an unknown name quoted back in the error (longer ones end in "...").
const MAX_QUOTED: usize = 80;

impl fmt::Display for UnknownOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Operation::ALL.iter().map(|o| o.as_str()).collect();
        write!(f, "unknown operation {:?} (expected one of {})", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownOperation {}

impl FromStr for Operation {
    type Err = UnknownOperation;

    fn from_str(s: &str) -> Result<Self, UnknownOperation> {
        Self::ALL.into_iter().find(|o| o.as_str() == s).ok_or_else(|| {
            if s.len() <= MAX_QUOTED {
                return UnknownOperation(s.to_owned());
            }
            let mut end = MAX_QUOTED;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            UnknownOperation(format!("{}...", &s[..end]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for (name, op) in Operation::NAMED {
            assert_eq!(name.parse::<Operation>(), Ok(op));
            assert_eq!(op.to_string(), name);
        }
        let mut names: Vec<_> = Operation::NAMED.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Operation::ALL.len());
    }

    #[test]
    fn unknown_names_are_quoted_short() {
        let long = "x".repeat(1000);
        let e = long.parse::<Operation>().unwrap_err().to_string();
        assert!(e.starts_with("unknown operation \"xxx"), "{e}");
        assert!(e.contains("xxx...\" (expected one of create, sign,"), "{e}");
        assert!(e.ends_with("random, admin)"), "{e}");
    }
}
