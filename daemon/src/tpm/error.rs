//! TPM errors, and the one place where TSS / TPM response codes are classified.
//!
//! Every `tss_esapi::Error` that leaves the TPM actor passes through [`TpmError::from_tss`],
//! which decides whether the TPM is gone (reconnect), busy (retry), locked out, out of object
//! memory, or refused the command for good. Nothing else in the crate looks at raw codes.

use std::fmt;

/// Why a TPM operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TpmError {
    /// The TPM cannot be reached (connection refused or lost, device missing). Retryable; the
    /// actor reconnects with backoff.
    #[error("TPM unavailable: {0}")]
    Unavailable(String),
    /// The TPM lost its volatile state under the vault (it was reset or restarted behind a
    /// transport that reconnected silently): loaded handles and sessions are gone. The actor
    /// reconnects, re-checks the SRK and retries once.
    #[error("TPM was reset: {0}")]
    Reset(String),
    /// The operation did not finish before its deadline (the TPM hangs or the queue is long).
    #[error("TPM did not answer within {0} ms")]
    Timeout(u64),
    /// Too many requests are queued for the TPM.
    #[error("TPM queue is full ({0} requests waiting)")]
    QueueFull(usize),
    /// The TPM kept answering RETRY/YIELDED/TESTING past the retry bound.
    #[error("TPM busy: {0}")]
    Busy(String),
    /// The TPM is in dictionary-attack lockout; password-protected keys are refused until it
    /// lifts. The text says when, as far as the TPM tells ([`lockout_detail`]; empty if unknown).
    #[error("TPM is in dictionary-attack lockout{}", if .0.is_empty() { String::new() } else { format!(" ({})", .0) })]
    Lockout(String),
    /// The vault's dictionary-attack guard refused a password attempt before it reached the
    /// TPM: fewer than `reserve` of the TPM's tries remain, and the vault never spends those (so
    /// it never drives the TPM into lockout; see [`crate::vault::lockout`]).
    #[error("{}", reserve_text(*.failures, *.max_tries, *.interval_s, *.reserve))]
    DaReserve {
        /// TPM_PT_LOCKOUT_COUNTER when the attempt was refused.
        failures: u32,
        /// TPM_PT_MAX_AUTH_FAIL.
        max_tries: u32,
        /// TPM_PT_LOCKOUT_INTERVAL: seconds per failure forgiven (0: never, only a reset).
        interval_s: u32,
        /// The configured reserve (`da_tpm_reserve`).
        reserve: u32,
    },
    /// No free transient object slot even after evicting every key the vault had loaded.
    #[error("TPM out of object memory")]
    ObjectMemory,
    /// The storage root key differs from the one recorded in the state directory: the TPM was
    /// cleared or replaced. Keys would not load; the daemon refuses to create new ones that would
    /// shadow the old.
    #[error("storage root key mismatch: recorded {expected}, TPM has {found} (TPM cleared or replaced?)")]
    SrkMismatch {
        /// Name recorded in the state directory (hex).
        expected: String,
        /// Name of the SRK the TPM derives now (hex).
        found: String,
    },
    /// A wrong password (auth value) was given for an object.
    #[error("authorization failed")]
    AuthFailed,
    /// TPM2_ActivateCredential refused the credential itself (it blamed the credential blob or
    /// the encrypted secret: made for another AK name or another EK, or corrupt).
    #[error("the TPM rejected the credential: {0}")]
    CredentialRejected(ResponseCode),
    /// A policy session did not satisfy the object's policy (e.g. PCR values differ).
    #[error("policy check failed")]
    PolicyFailed,
    /// The TPM signs RSA-PSS with a salt length other than the hash length, which TLS 1.3,
    /// rustls and OpenSSL refuse.
    #[error("this TPM produces RSA-PSS signatures with a non-standard salt length; use pkcs1 or an ECC key")]
    PssSaltUnsupported,
    /// A key blob or TPM structure could not be decoded.
    #[error("malformed TPM data: {0}")]
    Malformed(String),
    /// The TPM refused a command for a reason that retrying will not fix.
    #[error("TPM command {command} failed: {rc}")]
    Command {
        /// Command name, e.g. `TPM2_Sign`.
        command: &'static str,
        /// Decoded response code.
        rc: ResponseCode,
    },
}

/// `map_err` for a `tss-esapi` call: [`TpmError::from_tss`] for `what`.
pub(crate) fn wrap(what: &'static str) -> impl Fn(tss_esapi::Error) -> TpmError {
    move |e| TpmError::from_tss(what, e)
}

impl TpmError {
    /// Classifies an error returned by `tss-esapi` for `command`.
    pub fn from_tss(command: &'static str, err: tss_esapi::Error) -> Self {
        let rc = match err {
            tss_esapi::Error::WrapperError(kind) => {
                return Self::Malformed(format!("{command}: {kind}"));
            }
            tss_esapi::Error::Tss2Error(code) => ResponseCode::from_tss(code),
        };
        match rc.class() {
            RcClass::Communication => Self::Unavailable(format!("{command}: {rc}")),
            RcClass::Reset => Self::Reset(format!("{command}: {rc}")),
            RcClass::Retry => Self::Busy(format!("{command}: {rc}")),
            RcClass::Lockout => Self::Lockout(String::new()),
            RcClass::ObjectMemory => Self::ObjectMemory,
            RcClass::AuthFail => Self::AuthFailed,
            RcClass::PolicyFail => Self::PolicyFailed,
            RcClass::Permanent => Self::Command { command, rc },
        }
    }

    /// Classifies an error of TPM2_ActivateCredential: an error the TPM attributes to one of
    /// the command's parameters (the credential blob fails its integrity check, the secret does
    /// not decrypt with the EK) is [`TpmError::CredentialRejected`]; anything else is classified
    /// as [`TpmError::from_tss`] does.
    pub fn from_activation(err: tss_esapi::Error) -> Self {
        match ResponseCode::of(&err).filter(|rc| rc.parameter().is_some()) {
            Some(rc) => Self::CredentialRejected(rc),
            None => Self::from_tss("TPM2_ActivateCredential", err),
        }
    }

    /// A short, stable class name for metrics (`tpm_vault_tpm_errors_total{class=..}`).
    pub fn class_name(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Reset(_) => "reset",
            Self::Timeout(_) => "timeout",
            Self::QueueFull(_) => "queue_full",
            Self::Busy(_) => "busy",
            Self::Lockout(_) => "lockout",
            Self::DaReserve { .. } => "da_reserve",
            Self::ObjectMemory => "object_memory",
            Self::SrkMismatch { .. } => "srk_mismatch",
            Self::AuthFailed => "auth_failed",
            Self::CredentialRejected(_) => "credential_rejected",
            Self::PolicyFailed => "policy_failed",
            Self::PssSaltUnsupported => "pss_salt",
            Self::Malformed(_) => "malformed",
            Self::Command { .. } => "command",
        }
    }

    /// True when the connection to the TPM should be dropped and re-established.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Reset(_))
    }
}

/// Describes the TPM's dictionary-attack state from its properties: `failures` (TPM_PT_LOCKOUT_COUNTER),
/// `max_tries` (TPM_PT_MAX_AUTH_FAIL) and `interval_s` (TPM_PT_LOCKOUT_INTERVAL, seconds per
/// failure forgiven). The TPM is locked while failures ≥ max_tries, so it lifts after
/// `failures - max_tries + 1` intervals, less the time already spent in the current one (which
/// the TPM does not report): hence "at most".
pub fn lockout_detail(failures: u32, max_tries: u32, interval_s: u32) -> String {
    let excess = u64::from(failures.saturating_sub(max_tries)) + 1;
    let wait = excess * u64::from(interval_s);
    let until = if interval_s == 0 {
        "it lifts only by TPM2_DictionaryAttackLockReset or a TPM reset".to_owned()
    } else {
        format!("password-protected keys work again in at most {wait} s")
    };
    format!("{failures} failed authorizations, limit {max_tries}, one forgiven every {interval_s} s: {until}")
}

/// The message of a [`TpmError::DaReserve`] refusal: how many tries are left, and when
/// password-protected keys work again (once the TPM forgave enough failures that `reserve`
/// tries remain).
fn reserve_text(failures: u32, max_tries: u32, interval_s: u32, reserve: u32) -> String {
    let left = max_tries.saturating_sub(failures);
    let excess = u64::from(failures.saturating_add(reserve).saturating_sub(max_tries));
    let when = if interval_s == 0 {
        "password-protected keys work again only after TPM2_DictionaryAttackLockReset or a TPM reset".to_owned()
    } else {
        format!(
            "password-protected keys work again in at most {} s (the TPM forgives one failure every {interval_s} s)",
            excess * u64::from(interval_s)
        )
    };
    format!(
        "dictionary-attack reserve: the TPM has {left} of its {max_tries} password tries left and the vault keeps \
         the last {reserve}: {when}"
    )
}

/// What to do about a response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcClass {
    /// The TCTI (transport) failed: the TPM is gone or the link broke.
    Communication,
    /// TPM_RC_INITIALIZE, TPM_RC_HANDLE, TPM_RC_REFERENCE_*: the TPM no longer knows our
    /// handles or sessions (it was reset).
    Reset,
    /// TPM_RC_RETRY, YIELDED, TESTING, NV_RATE...: try again shortly.
    Retry,
    /// TPM_RC_LOCKOUT.
    Lockout,
    /// TPM_RC_OBJECT_MEMORY: flush something and retry.
    ObjectMemory,
    /// TPM_RC_AUTH_FAIL / BAD_AUTH: wrong password.
    AuthFail,
    /// TPM_RC_POLICY_FAIL / PCR mismatch in a policy.
    PolicyFail,
    /// Anything else.
    Permanent,
}

/// A TSS2 response code, kept as its raw value (layer in bits 16-23, TPM code below).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ResponseCode(pub u32);

/// TPM_RC_P: in a format-one code, the error is about a parameter (its number in bits 8-11).
const RC_P: u32 = 0x040;

/// TSS layer numbers (bits 16-23 of a TSS2_RC).
const LAYER_TPM: u32 = 0;
const LAYER_TCTI: u32 = 10;
/// TSS2_RESMGR_RC_LAYER: a user-space resource manager's own answer in the TPM's format (e.g.
/// tpm2-abrmd's 0xb0902, TPM_RC_OBJECT_MEMORY when a client holds its most transient objects).
const LAYER_RESMGR: u32 = 11;
const LAYER_RESMGR_TPM: u32 = 12;

/// TSS2 base response codes (any software layer) that mean the connection is unusable:
/// GENERAL_FAILURE, BAD_SEQUENCE (ESYS left mid-command), NO_CONNECTION, TRY_AGAIN, IO_ERROR,
/// MALFORMED_RESPONSE, INSUFFICIENT_RESPONSE, RSP_AUTH_FAILED (response HMAC broken).
const TRANSPORT_BASE_CODES: [u32; 8] = [1, 7, 8, 9, 10, 17, 19, 27];

/// TPM 2.0 response codes the vault acts on (Part 2, 6.6).
pub mod rc {
    /// Format-one base.
    pub const FMT1: u32 = 0x080;
    /// The TPM has not been started (TPM2_Startup needed).
    pub const INITIALIZE: u32 = 0x100;
    /// TPM_RC_PCR_CHANGED: PCRs changed while a policy session ran.
    pub const PCR_CHANGED: u32 = 0x128;
    /// TPM_RC_VALUE.
    pub const VALUE: u32 = FMT1 + 0x004;
    /// TPM_RC_HANDLE: the handle is not loaded.
    pub const HANDLE: u32 = FMT1 + 0x00B;
    /// TPM_RC_REFERENCE_H0: the first handle refers to nothing (first of the H0-H6, S0-S6 range).
    pub const REFERENCE_H0: u32 = 0x910;
    /// TPM_RC_REFERENCE_S6, last of that range.
    pub const REFERENCE_S6: u32 = 0x91E;
    /// TPM_RC_AUTH_FAIL.
    pub const AUTH_FAIL: u32 = FMT1 + 0x00E;
    /// TPM_RC_POLICY_FAIL.
    pub const POLICY_FAIL: u32 = FMT1 + 0x01D;
    /// TPM_RC_BAD_AUTH.
    pub const BAD_AUTH: u32 = FMT1 + 0x022;
    /// TPM_RC_CONTEXT_GAP.
    pub const CONTEXT_GAP: u32 = 0x901;
    /// TPM_RC_OBJECT_MEMORY.
    pub const OBJECT_MEMORY: u32 = 0x902;
    /// TPM_RC_SESSION_MEMORY.
    pub const SESSION_MEMORY: u32 = 0x903;
    /// TPM_RC_MEMORY.
    pub const MEMORY: u32 = 0x904;
    /// TPM_RC_YIELDED.
    pub const YIELDED: u32 = 0x908;
    /// TPM_RC_CANCELED.
    pub const CANCELED: u32 = 0x909;
    /// TPM_RC_TESTING.
    pub const TESTING: u32 = 0x90A;
    /// TPM_RC_NV_RATE.
    pub const NV_RATE: u32 = 0x920;
    /// TPM_RC_LOCKOUT.
    pub const LOCKOUT: u32 = 0x921;
    /// TPM_RC_RETRY.
    pub const RETRY: u32 = 0x922;
    /// TPM_RC_NV_UNAVAILABLE.
    pub const NV_UNAVAILABLE: u32 = 0x923;
}

impl ResponseCode {
    /// The response code inside a tss-esapi error; `None` for wrapper (non-TSS) errors.
    pub fn of(e: &tss_esapi::Error) -> Option<ResponseCode> {
        match e {
            tss_esapi::Error::Tss2Error(code) => Some(Self::from_tss(*code)),
            tss_esapi::Error::WrapperError(_) => None,
        }
    }

    fn from_tss(code: tss_esapi::constants::response_code::Tss2ResponseCode) -> Self {
        use tss_esapi::constants::response_code::Tss2ResponseCode as C;
        // tss-esapi keeps the raw value private but prints it in hex; parse it back once, here.
        let text = match code {
            C::Success => return Self(0),
            C::FormatZero(z) => z.to_string(),
            C::FormatOne(o) => o.to_string(),
        };
        let raw = text.rsplit("0x").next().and_then(|h| u32::from_str_radix(h.trim(), 16).ok()).unwrap_or(u32::MAX);
        Self(raw)
    }

    /// The TSS layer (0 = TPM, 10 = TCTI, ...).
    pub fn layer(self) -> u32 {
        (self.0 >> 16) & 0xff
    }

    /// The TPM response code with format-one parameter/handle/session numbers stripped, for
    /// TPM-layer codes; `None` for codes raised by the software stack.
    pub fn tpm_code(self) -> Option<u32> {
        if !matches!(self.layer(), LAYER_TPM | LAYER_RESMGR | LAYER_RESMGR_TPM) {
            return None;
        }
        let code = self.0 & 0xffff;
        Some(if code & rc::FMT1 != 0 { rc::FMT1 | (code & 0x3f) } else { code & 0x97f })
    }

    /// The command parameter (1-15) a format-one TPM code blames (`TPM_RC_P` set), if any.
    pub fn parameter(self) -> Option<u32> {
        if !matches!(self.layer(), LAYER_TPM | LAYER_RESMGR_TPM) {
            return None;
        }
        let code = self.0 & 0xffff;
        (code & (rc::FMT1 | RC_P) == rc::FMT1 | RC_P).then_some((code >> 8) & 0xf)
    }

    /// Decides what the vault does about this code.
    pub fn class(self) -> RcClass {
        if self.layer() == LAYER_TCTI {
            return RcClass::Communication;
        }
        match self.tpm_code() {
            Some(rc::RETRY | rc::YIELDED | rc::TESTING | rc::NV_RATE | rc::NV_UNAVAILABLE)
            | Some(rc::CANCELED | rc::CONTEXT_GAP | rc::PCR_CHANGED) => RcClass::Retry,
            Some(rc::LOCKOUT) => RcClass::Lockout,
            Some(rc::INITIALIZE | rc::HANDLE) => RcClass::Reset,
            Some(code) if (rc::REFERENCE_H0..=rc::REFERENCE_S6).contains(&code) => RcClass::Reset,
            Some(rc::OBJECT_MEMORY | rc::SESSION_MEMORY | rc::MEMORY) => RcClass::ObjectMemory,
            Some(rc::AUTH_FAIL | rc::BAD_AUTH) => RcClass::AuthFail,
            Some(rc::POLICY_FAIL) => RcClass::PolicyFail,
            // Raised by the software stack (ESYS, SYS, MU, RM) when the link broke or its
            // state machine was left mid-command by a broken link: reconnect.
            None if TRANSPORT_BASE_CODES.contains(&(self.0 & 0xffff)) => RcClass::Communication,
            _ => RcClass::Permanent,
        }
    }
}

impl fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.tpm_code() {
            Some(rc::INITIALIZE) => "TPM_RC_INITIALIZE",
            Some(rc::PCR_CHANGED) => "TPM_RC_PCR_CHANGED",
            Some(rc::VALUE) => "TPM_RC_VALUE",
            Some(rc::AUTH_FAIL) => "TPM_RC_AUTH_FAIL",
            Some(rc::POLICY_FAIL) => "TPM_RC_POLICY_FAIL",
            Some(rc::BAD_AUTH) => "TPM_RC_BAD_AUTH",
            Some(rc::OBJECT_MEMORY) => "TPM_RC_OBJECT_MEMORY",
            Some(rc::LOCKOUT) => "TPM_RC_LOCKOUT",
            Some(rc::RETRY) => "TPM_RC_RETRY",
            Some(rc::YIELDED) => "TPM_RC_YIELDED",
            Some(rc::TESTING) => "TPM_RC_TESTING",
            _ if self.layer() == LAYER_TCTI => "TCTI error",
            _ => "",
        };
        if name.is_empty() {
            write!(f, "rc {:#x}", self.0)
        } else {
            write!(f, "{name} ({:#x})", self.0)
        }
    }
}

impl fmt::Debug for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseCode({:#x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_codes_the_vault_acts_on() {
        assert_eq!(ResponseCode(0x000a000a).class(), RcClass::Communication);
        // ESYS bad sequence / malformed response after a broken link.
        assert_eq!(ResponseCode(0x0007_0007).class(), RcClass::Communication);
        assert_eq!(ResponseCode(0x0007_0011).class(), RcClass::Communication);
        // ESYS bad value (a caller bug) is not a connection problem.
        assert_eq!(ResponseCode(0x0007_000b).class(), RcClass::Permanent);
        assert_eq!(ResponseCode(0x922).class(), RcClass::Retry);
        assert_eq!(ResponseCode(0x90a).class(), RcClass::Retry);
        assert_eq!(ResponseCode(0x908).class(), RcClass::Retry);
        assert_eq!(ResponseCode(0x921).class(), RcClass::Lockout);
        assert_eq!(
            lockout_detail(5, 3, 10),
            "5 failed authorizations, limit 3, one forgiven every 10 s: password-protected keys work again in at most 30 s"
        );
        assert!(lockout_detail(3, 3, 0).contains("only by TPM2_DictionaryAttackLockReset"));
        let reserve = TpmError::DaReserve { failures: 9, max_tries: 10, interval_s: 30, reserve: 2 };
        assert_eq!(
            reserve.to_string(),
            "dictionary-attack reserve: the TPM has 1 of its 10 password tries left and the vault keeps the last 2: \
             password-protected keys work again in at most 30 s (the TPM forgives one failure every 30 s)"
        );
        assert_eq!(ResponseCode(0x902).class(), RcClass::ObjectMemory);
        // TPM_RC_POLICY_FAIL on session 1 (0x99d) and AUTH_FAIL on session 1 (0x98e).
        assert_eq!(ResponseCode(0x99d).class(), RcClass::PolicyFail);
        assert_eq!(ResponseCode(0x98e).class(), RcClass::AuthFail);
        // TPM_RC_INTEGRITY on parameter 1 (0x1df) and TPM_RC_VALUE on parameter 2 (0x2c4) blame
        // a parameter; TPM_RC_VALUE alone (0x084), a handle (0x18b) or a session (0x98e) do not.
        assert_eq!(ResponseCode(0x1df).parameter(), Some(1));
        assert_eq!(ResponseCode(0x2c4).parameter(), Some(2));
        assert_eq!(ResponseCode(0x084).parameter(), None);
        assert_eq!(ResponseCode(0x18b).parameter(), None);
        assert_eq!(ResponseCode(0x98e).parameter(), None);
        assert_eq!(ResponseCode(0x000a_01df).parameter(), None, "a TCTI code is no TPM parameter error");
        // TPM_RC_VALUE on parameter 1 (0x1c4) is permanent.
        assert_eq!(ResponseCode(0x1c4).class(), RcClass::Permanent);
        assert_eq!(ResponseCode(0x1c4).tpm_code(), Some(rc::VALUE));
        // Resource-manager wrapped TPM code, and tpm2-abrmd's own out-of-slots answer.
        assert_eq!(ResponseCode(0x000c0902).class(), RcClass::ObjectMemory);
        assert_eq!(ResponseCode(0x000b0902).class(), RcClass::ObjectMemory);
        assert_eq!(ResponseCode(0x000b0903).class(), RcClass::ObjectMemory);
        // Stale handles after a TPM reset: handle 1 unknown (0x18b), REFERENCE_H0, INITIALIZE.
        assert_eq!(ResponseCode(0x18b).class(), RcClass::Reset);
        assert_eq!(ResponseCode(0x910).class(), RcClass::Reset);
        assert_eq!(ResponseCode(0x100).class(), RcClass::Reset);
    }

    #[test]
    fn display_names_known_codes() {
        assert_eq!(ResponseCode(0x902).to_string(), "TPM_RC_OBJECT_MEMORY (0x902)");
        assert_eq!(ResponseCode(0x1c4).to_string(), "TPM_RC_VALUE (0x1c4)");
        assert_eq!(ResponseCode(0x12345).to_string(), "rc 0x12345");
    }
}
