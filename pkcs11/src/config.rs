//! Where the daemon is and what the token is called: read once, at the first `C_Initialize`.
//!
//! Order: the environment (`TPM_VAULT_SOCKET`, `TPM_VAULT_PKCS11_TOKEN_LABEL`), then the config
//! file (`TPM_VAULT_PKCS11_CONFIG`, default `/etc/tpm-vault/pkcs11.toml`, keys `socket` and
//! `token_label`), then the defaults (`/run/tpm-vault/vault.sock`, the host name). The values are
//! kept across `fork`, because nginx clears its workers' environment before they initialize the
//! module again.

use std::path::PathBuf;

use serde::Deserialize;

/// Default config file.
pub(crate) const DEFAULT_CONFIG: &str = "/etc/tpm-vault/pkcs11.toml";

/// The module's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The daemon's Unix socket.
    pub(crate) socket: PathBuf,
    /// Token label (at most 32 bytes are shown; PKCS#11 pads it with spaces).
    pub(crate) token_label: String,
}

/// The config file's contents; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The daemon's socket.
    socket: Option<PathBuf>,
    /// Token label.
    token_label: Option<String>,
}

impl Config {
    /// Reads the settings from the environment, the config file and the defaults.
    ///
    /// # Errors
    /// A message naming the config file when it exists but cannot be read or parsed (a
    /// missing default file is no error).
    pub(crate) fn load() -> Result<Config, String> {
        let explicit = std::env::var_os("TPM_VAULT_PKCS11_CONFIG").map(PathBuf::from);
        let path = explicit.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        let file = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str::<File>(&text).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => File::default(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let socket = std::env::var_os("TPM_VAULT_SOCKET")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or(file.socket)
            .unwrap_or_else(|| PathBuf::from(tpm_vault_client::DEFAULT_SOCKET));
        let token_label = std::env::var("TPM_VAULT_PKCS11_TOKEN_LABEL")
            .ok()
            .filter(|s| !s.is_empty())
            .or(file.token_label)
            .unwrap_or_else(host_name);
        Ok(Config { socket, token_label })
    }
}

/// The machine's host name, or "tpm-vault" if it has none.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and the last byte stays 0.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_owned(),
        _ => "tpm-vault".to_owned(),
    }
}
