//! `--auth` and `--auth-file`: where `key create` and `sign` get a key's password.
//!
//! Owns the two sources (the `TPM_VAULT_KEY_AUTH` environment variable, or a file / stdin) and
//! reading them into a [`KeyAuth`] without leaving unzeroed copies behind. A password is never
//! taken from the command line itself, where other users could read it in `ps`.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use clap::Args;
use zeroize::Zeroizing;

use tpm_vault_client::{Error, KeyAuth, MAX_KEY_AUTH};

use super::error::CliError;
use super::files;

/// The environment variable `--auth` reads.
pub(crate) const AUTH_ENV: &str = "TPM_VAULT_KEY_AUTH";

/// Bytes read from a password file at most: the longest password and a CRLF, plus one byte
/// to tell that it is too long.
const READ_LIMIT: usize = MAX_KEY_AUTH + 3;

/// The password options.
#[derive(Debug, Args)]
pub(crate) struct AuthArgs {
    /// The key has a password: take it from the TPM_VAULT_KEY_AUTH environment variable
    #[arg(long, conflicts_with = "auth_file")]
    pub(crate) auth: bool,
    /// The key has a password: read it from FILE (- for stdin); a final newline is dropped
    ///
    /// 1 to 32 bytes.
    #[arg(long, value_name = "FILE")]
    pub(crate) auth_file: Option<PathBuf>,
}

impl AuthArgs {
    /// True when a password is to be read from standard input.
    pub(crate) fn reads_stdin(&self) -> bool {
        self.auth_file.as_deref().is_some_and(files::is_std)
    }

    /// The password, if one was asked for.
    pub(crate) fn load(&self) -> Result<Option<KeyAuth>, CliError> {
        if self.auth {
            return from_env(std::env::var_os(AUTH_ENV)).map(Some);
        }
        match &self.auth_file {
            Some(path) => from_file(path).map(Some),
            None => Ok(None),
        }
    }
}

/// The password in the environment variable's value.
fn from_env(value: Option<OsString>) -> Result<KeyAuth, CliError> {
    let bytes = Zeroizing::new(value.map(OsStringExt::into_vec).unwrap_or_default());
    if bytes.is_empty() {
        return Err(
            Error::InvalidInput(format!("--auth: the {AUTH_ENV} environment variable is not set or empty")).into()
        );
    }
    Ok(KeyAuth::new(bytes)?)
}

/// The password in a file, without one final newline.
fn from_file(path: &Path) -> Result<KeyAuth, CliError> {
    // Room for everything that may be read, so the buffer is never reallocated (which would
    // leave a copy behind that is not zeroed).
    let mut bytes = Zeroizing::new(Vec::with_capacity(READ_LIMIT * 2));
    files::open(path)?.take(READ_LIMIT as u64).read_to_end(&mut bytes).map_err(CliError::read(path))?;
    let newline = if bytes.ends_with(b"\r\n") { 2 } else { usize::from(bytes.ends_with(b"\n")) };
    let len = bytes.len() - newline;
    bytes.truncate(len);
    KeyAuth::new(bytes).map_err(|e| Error::InvalidInput(format!("--auth-file {}: {e}", path.display())).into())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    #[test]
    fn flags_parse_and_conflict() {
        let cli = Cli::try_parse_from(["tpm-vault", "key", "create", "k", "--auth"]).unwrap();
        let Command::Key(super::super::key::KeyCommand::Create(args)) = cli.command else { panic!("key create") };
        assert!(args.auth.auth && args.auth.auth_file.is_none());
        let cli =
            Cli::try_parse_from(["tpm-vault", "sign", "k", "--in", "f", "--out", "s", "--auth-file", "-"]).unwrap();
        let Command::Sign(args) = cli.command else { panic!("sign") };
        assert!(args.auth.reads_stdin());
        assert!(Cli::try_parse_from(["tpm-vault", "key", "create", "k", "--auth", "--auth-file", "pw"]).is_err());
        assert!(Cli::try_parse_from(["tpm-vault", "verify", "k", "--in", "f", "--sig", "s", "--auth"]).is_err());
    }

    #[test]
    fn env_value() {
        let auth = from_env(Some("s3cret".into())).unwrap();
        assert_eq!(auth.bytes(), b"s3cret");
        let err = from_env(None).unwrap_err();
        assert_eq!(err.to_string(), "--auth: the TPM_VAULT_KEY_AUTH environment variable is not set or empty");
        assert_eq!(err.exit_code(), 2);
        assert!(from_env(Some("".into())).is_err());
        assert!(from_env(Some("x".repeat(33).into())).is_err());
    }

    #[test]
    fn file_drops_one_final_newline() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&[u8], &[u8]); 4] = [(b"pw\n", b"pw"), (b"pw\r\n", b"pw"), (b"pw", b"pw"), (b"pw\n\n", b"pw\n")];
        for (content, expected) in cases {
            let path = dir.path().join("pw");
            std::fs::write(&path, content).unwrap();
            assert_eq!(from_file(&path).unwrap().bytes(), expected);
        }
        let path = dir.path().join("long");
        std::fs::write(&path, [b'x'; 33]).unwrap();
        let err = from_file(&path).unwrap_err().to_string();
        assert!(err.ends_with("the key password has 33 bytes; at most 32 are allowed"), "{err}");
        std::fs::write(&path, "\n").unwrap();
        assert!(from_file(&path).unwrap_err().to_string().ends_with("the key password is empty"));
        let missing = dir.path().join("missing");
        assert!(from_file(&missing).unwrap_err().to_string().starts_with("cannot read"));
    }
}
