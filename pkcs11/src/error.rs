//! What a failure becomes at the C boundary: one table from the daemon's gRPC codes (and the
//! module's own checks) to PKCS#11 return values. README's PKCS#11 section prints the same table.
//!
//! | daemon / module says | `CK_RV` |
//! |---|---|
//! | socket cannot be opened, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED` (TPM busy) | `CKR_DEVICE_ERROR` (the next call reconnects) |
//! | `PERMISSION_DENIED` by the access policy | `CKR_FUNCTION_REJECTED` |
//! | (module) signing while the real and effective uid differ (a setuid program) | `CKR_FUNCTION_FAILED` |
//! | (module) `C_DestroyObject` without `allow_destroy` in pkcs11.toml | `CKR_ACTION_PROHIBITED` |
//! | `UNAUTHENTICATED` (wrong key password; older daemons: `PERMISSION_DENIED` "wrong key password") | `CKR_PIN_INCORRECT` |
//! | `PERMISSION_DENIED` "needs its password" | `CKR_USER_NOT_LOGGED_IN` |
//! | `RESOURCE_EXHAUSTED` dictionary-attack lockout | `CKR_PIN_LOCKED` |
//! | `FAILED_PRECONDITION` (PCR values differ from the key's binding) | `CKR_KEY_FUNCTION_NOT_PERMITTED` |
//! | `NOT_FOUND` (the key was deleted meanwhile) | `CKR_KEY_HANDLE_INVALID` / `CKR_OBJECT_HANDLE_INVALID` |
//! | `ALREADY_EXISTS`, `INVALID_ARGUMENT` while creating | `CKR_ATTRIBUTE_VALUE_INVALID` |
//! | `INVALID_ARGUMENT` while signing | `CKR_DATA_INVALID` |
//! | anything else | `CKR_FUNCTION_FAILED` |

use cryptoki_sys::*;
use tpm_vault_client::{Code, Error as ClientError};

/// A PKCS#11 return value other than `CKR_OK`.
pub(crate) type Rv = CK_RV;

/// The module's result type: the error is the return value the entry point gives.
pub(crate) type Result<T> = std::result::Result<T, Rv>;

/// What the failed daemon call was doing, where one gRPC code means different things.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doing {
    /// Signing (or anything else with a key handle).
    Sign,
    /// Creating a key or storing a certificate.
    Create,
    /// Anything else (listing, deleting, random bytes).
    Other,
}

/// Maps a daemon (client library) error to its return value, per the table above.
pub(crate) fn from_client(e: &ClientError, doing: Doing) -> Rv {
    crate::debug(format_args!("daemon call failed: {e}"));
    let message = e.status().map(|s| s.message()).unwrap_or_default();
    match e.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => CKR_DEVICE_ERROR,
        Code::ResourceExhausted if message.contains("lockout") || message.contains("dictionary") => CKR_PIN_LOCKED,
        Code::ResourceExhausted => CKR_DEVICE_ERROR,
        Code::Unauthenticated => CKR_PIN_INCORRECT,
        // A daemon before 0.2 said PERMISSION_DENIED for a wrong password.
        Code::PermissionDenied if message.contains("wrong key password") => CKR_PIN_INCORRECT,
        Code::PermissionDenied if message.contains("needs its password") => CKR_USER_NOT_LOGGED_IN,
        Code::PermissionDenied => CKR_FUNCTION_REJECTED,
        Code::FailedPrecondition => CKR_KEY_FUNCTION_NOT_PERMITTED,
        Code::NotFound if doing == Doing::Sign => CKR_KEY_HANDLE_INVALID,
        Code::NotFound => CKR_OBJECT_HANDLE_INVALID,
        Code::AlreadyExists | Code::InvalidArgument if doing == Doing::Create => CKR_ATTRIBUTE_VALUE_INVALID,
        Code::InvalidArgument if doing == Doing::Sign => CKR_DATA_INVALID,
        _ => CKR_FUNCTION_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, message: &str) -> ClientError {
        ClientError::from(tonic::Status::new(code, message))
    }

    #[test]
    fn table() {
        let cases = [
            (Code::Unavailable, "TPM unavailable; retry later", Doing::Sign, CKR_DEVICE_ERROR),
            (Code::PermissionDenied, "access denied by policy", Doing::Sign, CKR_FUNCTION_REJECTED),
            (Code::Unauthenticated, "wrong key password", Doing::Sign, CKR_PIN_INCORRECT),
            (Code::PermissionDenied, "wrong key password", Doing::Sign, CKR_PIN_INCORRECT),
            (Code::PermissionDenied, "key k needs its password", Doing::Sign, CKR_USER_NOT_LOGGED_IN),
            (Code::ResourceExhausted, "TPM in dictionary-attack lockout", Doing::Sign, CKR_PIN_LOCKED),
            (Code::ResourceExhausted, "TPM busy; retry later", Doing::Sign, CKR_DEVICE_ERROR),
            (Code::FailedPrecondition, "PCR 9 differs", Doing::Sign, CKR_KEY_FUNCTION_NOT_PERMITTED),
            (Code::NotFound, "no key", Doing::Sign, CKR_KEY_HANDLE_INVALID),
            (Code::NotFound, "no key", Doing::Other, CKR_OBJECT_HANDLE_INVALID),
            (Code::AlreadyExists, "exists", Doing::Create, CKR_ATTRIBUTE_VALUE_INVALID),
            (Code::InvalidArgument, "bad digest", Doing::Sign, CKR_DATA_INVALID),
            (Code::Internal, "boom", Doing::Other, CKR_FUNCTION_FAILED),
        ];
        for (code, message, doing, rv) in cases {
            assert_eq!(from_client(&status(code, message), doing), rv, "{code:?} {message}");
        }
    }
}
