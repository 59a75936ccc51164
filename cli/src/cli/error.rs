//! CLI failures: how they are printed and which exit status they give.
//!
//! Owns the mapping from gRPC codes to exit statuses (listed in `tpm-vault --help`). It does not
//! word the messages of client errors: [`tpm_vault_client::Error`]'s `Display` does.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tonic::Code;

use crate::acme::AcmeError;
use tpm_vault_client::io_reason;
use tpm_vault_client::{Error, QuoteError};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The client library failed: no daemon, an error status, input rejected locally.
    #[error("{0}")]
    Client(#[from] Error),
    /// A local file (or stdin/stdout, path `-`) could not be read or written.
    #[error("cannot {action} {}: {}", display_path(.path, .action), io_reason(.source))]
    Io {
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The file; `-` for stdin/stdout.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// `verify` found the signature wrong: a result rather than an error, printed as OpenSSL
    /// does.
    #[error("Verification failure")]
    VerificationFailed,
    /// `verify-quote` rejected the quote, for the reason given.
    #[error("quote rejected: {0}")]
    QuoteRejected(QuoteError),
    /// `verify-srk` rejected the SRK certification, for the reason given.
    #[error("SRK certification rejected: {0}")]
    SrkRejected(tpm_vault_client::attest::SrkCertError),
    /// `verify-quote` without `--ak`: the quote checks out, but only against the AK that came
    /// with it in this directory, which proves nothing about the device (a result, already
    /// printed on stdout).
    #[error(
        "the quote was checked only against {}/ak.pub.pem, not against an enrolled AK: pass the device's AK with --ak FILE (or --allow-unenrolled-ak)",
        .0.display()
    )]
    SignerNotEnrolled(PathBuf),
    /// `eventlog replay` found a PCR of the TPM that the log does not explain: a result,
    /// already printed on stdout, named here.
    #[error("the TPM does not agree with the event log: {0}")]
    LogDisagrees(String),
    /// `access check` found the operation denied: a result, already printed on stdout.
    #[error("denied by the access policy")]
    AccessDenied,
    /// ACME enrollment or renewal failed at the CA (or before reaching it).
    #[error("{0}")]
    Acme(AcmeError),
    /// The Keylime agent stopped on something retrying cannot fix (settings, a registrar that
    /// refuses this TPM for this UUID).
    #[error("{0}")]
    Keylime(crate::keylime::KeylimeError),
}

impl From<crate::keylime::KeylimeError> for CliError {
    /// Vault errors keep their own exit statuses.
    fn from(e: crate::keylime::KeylimeError) -> CliError {
        match e {
            crate::keylime::KeylimeError::Vault(e) => CliError::Client(e),
            other => CliError::Keylime(other),
        }
    }
}

impl From<AcmeError> for CliError {
    /// Vault errors keep their own exit statuses.
    fn from(e: AcmeError) -> CliError {
        match e {
            AcmeError::Vault(e) => CliError::Client(e),
            other => CliError::Acme(other),
        }
    }
}

impl CliError {
    /// A failure to read `path` (`-` = stdin).
    pub(crate) fn read(path: &Path) -> impl FnOnce(io::Error) -> CliError + '_ {
        move |source| CliError::Io { action: "read", path: path.to_path_buf(), source }
    }

    /// A failure to write `path` (`-` = stdout).
    pub(crate) fn write(path: &Path) -> impl FnOnce(io::Error) -> CliError + '_ {
        move |source| CliError::Io { action: "write", path: path.to_path_buf(), source }
    }

    /// A failure to write stdout.
    pub(crate) fn stdout(source: io::Error) -> CliError {
        CliError::write(Path::new("-"))(source)
    }

    /// The exit status (see `EXIT_STATUS_HELP`).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Client(err) if err.is_socket_permission() => 9,
            CliError::Client(err) => match err.code() {
                Code::InvalidArgument | Code::OutOfRange => 2,
                Code::NotFound => 3,
                Code::AlreadyExists => 4,
                Code::PermissionDenied => 5,
                Code::FailedPrecondition => 6,
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => 7,
                Code::ResourceExhausted => 8,
                Code::Unauthenticated => 10,
                _ => 1,
            },
            CliError::Io { .. }
            | CliError::VerificationFailed
            | CliError::QuoteRejected(_)
            | CliError::SrkRejected(_)
            | CliError::LogDisagrees(_) => 1,
            CliError::AccessDenied => 5,
            CliError::SignerNotEnrolled(_) => 12,
            CliError::Acme(AcmeError::Local(_)) => 1,
            CliError::Acme(_) => 11,
            CliError::Keylime(crate::keylime::KeylimeError::Config(_)) => 2,
            CliError::Keylime(_) => 11,
        }
    }

    /// Prints the error as one line on stderr and returns the exit status.
    ///
    /// A closed stdout (`tpm-vault key list | head -1`) is not an error worth a message: the
    /// reader went away on purpose.
    pub(crate) fn report(&self) -> ExitCode {
        if let CliError::Io { source, .. } = self {
            if source.kind() == io::ErrorKind::BrokenPipe {
                return ExitCode::SUCCESS;
            }
        }
        let mut stderr = io::stderr().lock();
        // Nothing sensible is left to do if stderr itself is gone.
        let _ = match self {
            CliError::VerificationFailed => writeln!(stderr, "{self}"),
            CliError::AccessDenied => Ok(()),
            _ => writeln!(stderr, "tpm-vault: {self}"),
        };
        ExitCode::from(self.exit_code())
    }
}

fn display_path(path: &Path, action: &str) -> String {
    if path == Path::new("-") {
        match action {
            "read" => "standard input".to_owned(),
            _ => "standard output".to_owned(),
        }
    } else {
        path.display().to_string()
    }
}
