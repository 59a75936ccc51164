//! The client's error type.
//!
//! Owns the mapping from what can go wrong on the client side (no daemon, a gRPC status from
//! the daemon, bad input caught before sending) to one-line messages and gRPC codes. It does
//! not decide exit codes: that is the CLI's business (`cli::error`).

use std::io;
use std::path::PathBuf;

use tonic::Code;

/// An error from a [`Client`](crate::Client) or [`BlockingClient`](crate::BlockingClient) call.
///
/// `Display` is always a single line meant for a person; [`Error::code`] is meant for programs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The daemon's socket could not be connected to: the daemon is not running, the path is
    /// wrong, or the caller may not open the socket.
    #[error("cannot connect to {}: {reason}{}", .socket.display(), .cause.hint())]
    Transport {
        /// The socket path that was tried.
        socket: PathBuf,
        /// The operating system's reason, without the `(os error N)` suffix.
        reason: String,
        /// What the failure means for the caller: nobody listens, or no permission.
        cause: ConnectFailure,
        /// The underlying transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The daemon answered the call with an error status (or the call failed in transit).
    #[error("{}", status_line(.0))]
    Status(tonic::Status),
    /// The input was rejected before anything was sent, e.g. a malformed PCR selection.
    #[error("{0}")]
    InvalidInput(String),
    /// The private runtime of a [`BlockingClient`](crate::BlockingClient) could not be started.
    #[error("cannot start the client runtime: {0}")]
    Runtime(#[source] io::Error),
    /// Reading the caller's input of a streaming call (the data to encrypt or decrypt) failed.
    #[error("cannot read the input: {}", io_reason(.0))]
    Read(#[source] io::Error),
    /// Writing the output of a streaming call (encrypted data, plaintext, random bytes) to the
    /// caller's writer failed.
    #[error("cannot write the output: {}", io_reason(.0))]
    Write(#[source] io::Error),
}

impl Error {
    /// The gRPC code that best describes this error.
    ///
    /// For [`Error::Status`] it is the daemon's code (`NotFound`, `PermissionDenied`...);
    /// a failed connection is `Unavailable`; input rejected locally is `InvalidArgument`.
    pub fn code(&self) -> Code {
        match self {
            Error::Status(status) => status.code(),
            Error::Transport { .. } => Code::Unavailable,
            Error::InvalidInput(_) => Code::InvalidArgument,
            Error::Runtime(_) | Error::Read(_) | Error::Write(_) => Code::Internal,
        }
    }

    /// The gRPC status, when the daemon (or the channel) produced one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Error::Status(status) => Some(status),
            _ => None,
        }
    }

    /// True when the error says the daemon does not seem to be running at the socket path.
    pub fn is_daemon_down(&self) -> bool {
        matches!(self, Error::Transport { cause: ConnectFailure::DaemonDown, .. })
    }

    /// True when the caller may not open the daemon's socket: a permanent error until the
    /// caller joins the socket's group, not one to retry.
    pub fn is_socket_permission(&self) -> bool {
        matches!(self, Error::Transport { cause: ConnectFailure::PermissionDenied { .. }, .. })
    }

    /// Builds [`Error::Transport`] from a failed connection to `socket`.
    pub(crate) fn transport(socket: PathBuf, source: tonic::transport::Error) -> Error {
        let io = find_io_error(&source);
        let cause = match io.map(io::Error::kind) {
            Some(io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused) => ConnectFailure::DaemonDown,
            Some(io::ErrorKind::PermissionDenied) => ConnectFailure::PermissionDenied { group: socket_group(&socket) },
            _ => ConnectFailure::Other,
        };
        let reason = match io {
            Some(e) => io_reason(e),
            None => one_line(&source.to_string()),
        };
        Error::Transport { socket, reason, cause, source }
    }
}

/// What a failed connection to the daemon's socket means for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// Nobody listens at the path (no such file, connection refused): the daemon is not running.
    DaemonDown,
    /// The caller may not open the socket (or a directory above it).
    PermissionDenied {
        /// The group that owns the socket, when it could be read: members may connect.
        group: Option<String>,
    },
    /// Anything else (a timeout, a protocol failure).
    Other,
}

impl ConnectFailure {
    /// The hint printed after the operating system's reason.
    fn hint(&self) -> String {
        match self {
            ConnectFailure::DaemonDown => " (is tpm-vaultd running?)".to_owned(),
            ConnectFailure::PermissionDenied { group: Some(group) } => {
                format!(" (only root and members of group '{group}' may use the vault: ask to be added to it)")
            }
            ConnectFailure::PermissionDenied { group: None } => {
                " (the socket or a directory above it is not open to you: ask to be added to the vault's group)"
                    .to_owned()
            }
            ConnectFailure::Other => String::new(),
        }
    }
}

/// The name of the group that owns `socket`, if its metadata and the group database say.
fn socket_group(socket: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(socket).ok()?.gid();
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)).ok()??;
    Some(group.name)
}

impl From<tonic::Status> for Error {
    /// Keeps the daemon's status; a connection that broke under the call (tonic's `UNKNOWN`
    /// "broken pipe") becomes `UNAVAILABLE`, as gRPC reports transport failures.
    fn from(status: tonic::Status) -> Error {
        Error::Status(tpm_vault_proto::status::normalize(status))
    }
}

/// A short, clean description of an I/O error: `No such file or directory`, without the
/// `(os error 2)` that `io::Error`'s `Display` appends.
pub fn io_reason(e: &io::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    };
    one_line(&text)
}

/// Collapses any run of whitespace or control characters into one space, so that a message
/// from the peer can never break the one-line rule (or smuggle terminal escapes).
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut gap = false;
    for c in text.trim().chars() {
        if c.is_whitespace() || c.is_control() {
            gap = true;
        } else {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        }
    }
    out
}

fn status_line(status: &tonic::Status) -> String {
    let message = one_line(status.message());
    // tonic's own wording for a client-side deadline (`TimeoutExpired`) says nothing useful.
    if status.code() == Code::Cancelled && message == "Timeout expired" {
        return "request timed out: tpm-vaultd did not answer in time".to_owned();
    }
    if !message.is_empty() {
        return message;
    }
    // No message: fall back to the code's description, lower-cased like the rest.
    let description = status.code().description();
    let mut chars = description.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => format!("{:?}", status.code()),
    }
}

fn find_io_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_display_is_the_message_on_one_line() {
        let err = Error::from(tonic::Status::not_found("key \"web\"\nnot found"));
        assert_eq!(err.to_string(), "key \"web\" not found");
        assert_eq!(err.code(), Code::NotFound);
    }

    #[test]
    fn status_without_message_uses_the_code() {
        let err = Error::from(tonic::Status::new(Code::PermissionDenied, ""));
        assert_eq!(err.to_string(), "the caller does not have permission to execute the specified operation");
    }

    #[test]
    fn client_timeout_is_explained() {
        let err = Error::from(tonic::Status::cancelled("Timeout expired"));
        assert_eq!(err.to_string(), "request timed out: tpm-vaultd did not answer in time");
    }

    #[test]
    fn io_reason_drops_the_os_error_suffix() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(io_reason(&e), "No such file or directory");
        let e = io::Error::other("plain");
        assert_eq!(io_reason(&e), "plain");
    }

    #[test]
    fn one_line_strips_controls() {
        assert_eq!(one_line("  a\r\n\tb\x1b[31mc  "), "a b [31mc");
    }

    #[test]
    fn invalid_input_code() {
        assert_eq!(Error::InvalidInput("x".into()).code(), Code::InvalidArgument);
    }
}
