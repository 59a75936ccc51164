//! The error → gRPC status map, and the only place that builds a gRPC [`Status`]: from an
//! [`Error`], for a request cut off by shutdown, or for a message over its method's size bound.
//! Peers get a message naming the cause in their terms; TPM response codes, handles and paths
//! go to the log only.

use tonic::Status;

use crate::error::Error;
use crate::store::StoreError;
use crate::tpm::TpmError;

impl From<&Error> for Status {
    fn from(e: &Error) -> Status {
        match e {
            Error::InvalidArgument(m) => Status::invalid_argument(m.to_string()),
            Error::KeyNotFound(_) | Error::NoCertificate(_) => Status::not_found(e.to_string()),
            Error::NoEventLog(m) => Status::not_found(m.clone()),
            Error::EventLogUnreadable(m) => Status::failed_precondition(m.clone()),
            Error::KeyExists(_) => Status::already_exists(e.to_string()),
            Error::PermissionDenied(d) => Status::permission_denied(d.to_string()),
            Error::PcrMismatch(m) => Status::failed_precondition(m.clone()),
            Error::Throttled { .. } => Status::resource_exhausted(e.to_string()),
            Error::ClientBusy(b) => Status::resource_exhausted(b.to_string()),
            Error::Tpm(t) => tpm_status(t),
            Error::Store(s) => {
                tracing::error!(error = %s, "state directory error");
                match s {
                    StoreError::Io { source, .. } if is_storage_full_or_readonly(source) => {
                        Status::resource_exhausted("the vault cannot write its state (disk full or read-only)")
                    }
                    _ => Status::internal("state directory error; see the daemon log"),
                }
            }
            Error::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                Status::internal("internal error; see the daemon log")
            }
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        Status::from(&e)
    }
}

/// The status of a request still running when the drain time of a shutdown ran out. Not an
/// [`Error`]: the request never failed, the daemon is leaving.
pub(crate) fn shutting_down() -> Status {
    Status::unavailable("tpm-vaultd is shutting down; retry")
}

/// The status of a request whose message declares `len` bytes where its method takes at most
/// `limit` ([`crate::serve::bounds::FrameLimit`], before the message is read).
pub(crate) fn message_too_large(len: usize, limit: usize) -> Status {
    Status::out_of_range(format!("message of {len} bytes declared; this method takes at most {limit}"))
}

fn tpm_status(t: &TpmError) -> Status {
    match t {
        TpmError::Unavailable(why) | TpmError::Reset(why) => {
            tracing::warn!(error = %why, "TPM unavailable");
            Status::unavailable("TPM unavailable; retry later")
        }
        TpmError::Timeout(ms) => Status::unavailable(format!("TPM did not answer within {ms} ms; retry later")),
        TpmError::QueueFull(n) => Status::resource_exhausted(format!("TPM busy: {n} requests queued; retry later")),
        TpmError::Busy(why) => {
            tracing::warn!(error = %why, "TPM busy");
            Status::resource_exhausted("TPM busy; retry later")
        }
        TpmError::Lockout(_) | TpmError::DaReserve { .. } => Status::resource_exhausted(t.to_string()),
        TpmError::ObjectMemory => Status::resource_exhausted("TPM out of object memory; retry later"),
        TpmError::SrkMismatch { .. } => {
            tracing::error!(error = %t, "TPM refused");
            Status::failed_precondition("this TPM is not the one the vault's keys belong to (cleared or replaced)")
        }
        TpmError::AuthFailed => Status::unauthenticated("wrong key password"),
        TpmError::CredentialRejected(rc) => {
            tracing::info!(%rc, "credential activation refused by the TPM");
            Status::permission_denied("the credential was not made for this TPM's AK and EK")
        }
        TpmError::ImportRejected(rc) => {
            tracing::info!(%rc, "import refused by the TPM");
            Status::invalid_argument(
                "the TPM refused the sealed blob: it was made for another TPM's storage key, or altered \
                 (TPM2_Import's integrity check failed)",
            )
        }
        TpmError::PolicyFailed => Status::failed_precondition("the key's PCR policy is not satisfied"),
        TpmError::PssSaltUnsupported => Status::failed_precondition(t.to_string()),
        TpmError::Malformed(_) | TpmError::Command { .. } => {
            tracing::error!(error = %t, "TPM command failed");
            Status::internal("TPM command failed; see the daemon log")
        }
    }
}

fn is_storage_full_or_readonly(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == nix::libc::ENOSPC || code == nix::libc::EROFS || code == nix::libc::EDQUOT)
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::auth::Denied;
    use crate::model::KeyName;

    fn code(e: Error) -> Code {
        Status::from(&e).code()
    }

    #[test]
    fn every_arm_maps_to_its_code() {
        let name = KeyName::try_from("k").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(code(Error::invalid("x")), Code::InvalidArgument);
        assert_eq!(code(Error::not_found(&name)), Code::NotFound);
        assert_eq!(code(Error::NoCertificate(name.clone())), Code::NotFound);
        assert_eq!(code(Error::NoEventLog("none".into())), Code::NotFound);
        assert_eq!(code(Error::EventLogUnreadable("denied".into())), Code::FailedPrecondition);
        assert_eq!(code(Error::KeyExists(name.clone())), Code::AlreadyExists);
        assert_eq!(code(Error::from(StoreError::Exists(name.clone()))), Code::AlreadyExists);
        assert_eq!(code(Error::from(StoreError::Refused { name: name.clone() })), Code::PermissionDenied);
        assert_eq!(code(Error::from(Denied::ForeignAuthority)), Code::PermissionDenied);
        assert_eq!(code(Error::PcrMismatch("pcr 9".into())), Code::FailedPrecondition);
        let throttled = Error::Throttled { key: name.clone(), wait: std::time::Duration::from_millis(1500) };
        assert_eq!(
            Status::from(&throttled).message(),
            "too many wrong passwords for key k (dictionary-attack guard): further attempts are refused for 1.5 s"
        );
        assert_eq!(code(throttled), Code::ResourceExhausted);
        let long = Error::Throttled { key: name.clone(), wait: std::time::Duration::from_millis(12_001) };
        assert!(Status::from(&long).message().ends_with("refused for 13 s"));
        assert_eq!(code(Error::Tpm(TpmError::Unavailable("x".into()))), Code::Unavailable);
        assert_eq!(code(Error::Tpm(TpmError::Timeout(1))), Code::Unavailable);
        assert_eq!(code(Error::Tpm(TpmError::QueueFull(1))), Code::ResourceExhausted);
        assert_eq!(code(Error::Tpm(TpmError::Busy("x".into()))), Code::ResourceExhausted);
        assert_eq!(code(Error::Tpm(TpmError::Lockout(String::new()))), Code::ResourceExhausted);
        assert_eq!(code(Error::Tpm(TpmError::ObjectMemory)), Code::ResourceExhausted);
        let reserve = TpmError::DaReserve { failures: 2, max_tries: 3, interval_s: 1000, reserve: 2 };
        assert_eq!(code(Error::Tpm(reserve)), Code::ResourceExhausted);
        assert_eq!(code(Error::Tpm(TpmError::AuthFailed)), Code::Unauthenticated);
        let rejected = TpmError::CredentialRejected(crate::tpm::error::ResponseCode(0x1df));
        assert_eq!(code(Error::Tpm(rejected)), Code::PermissionDenied);
        assert_eq!(code(Error::Tpm(TpmError::PolicyFailed)), Code::FailedPrecondition);
        assert_eq!(code(Error::Tpm(TpmError::PssSaltUnsupported)), Code::FailedPrecondition);
        let mismatch = TpmError::SrkMismatch { expected: "a".into(), found: "b".into() };
        assert_eq!(code(Error::Tpm(mismatch)), Code::FailedPrecondition);
        assert_eq!(code(Error::Tpm(TpmError::Malformed("x".into()))), Code::Internal);
        assert_eq!(code(Error::Internal("x".into())), Code::Internal);
        let full = std::io::Error::from_raw_os_error(nix::libc::ENOSPC);
        assert_eq!(code(Error::Store(StoreError::Io { path: "/x".into(), source: full })), Code::ResourceExhausted);
    }

    #[test]
    fn internals_do_not_leak() {
        let s = Status::from(&Error::Tpm(TpmError::Unavailable("swtpm:host=127.0.0.1,port=2321 refused".into())));
        assert!(!s.message().contains("127.0.0.1"));
        let s = Status::from(&Error::Internal("/var/lib/tpm-vault/keys/x".into()));
        assert!(!s.message().contains("/var/lib"));
    }
}
