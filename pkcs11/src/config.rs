//! Where the daemon is, what the token is called and what it allows: read once, at the first
//! `C_Initialize`.
//!
//! Order: the environment (`TPM_VAULT_SOCKET`, `TPM_VAULT_PKCS11_TOKEN_LABEL`), then the config
//! file (`TPM_VAULT_PKCS11_CONFIG`, default `/etc/tpm-vault/pkcs11.toml`, keys `socket`,
//! `token_label`, `allow_destroy`, `allow_sha1_digest_info`), then the defaults
//! (`/run/tpm-vault/vault.sock`, the host name, both `false`). The values are kept across
//! `fork`, because nginx clears its workers' environment before they initialize the module again.
//!
//! **Secure execution.** In a setuid or setgid program (`getauxval(AT_SECURE)`), or any process
//! whose real and effective uid or gid differ, the environment belongs to a less privileged
//! caller: every `TPM_VAULT_*` variable is ignored and only `/etc/tpm-vault/pkcs11.toml` is read,
//! and only if it is a regular file owned by root and writable by nobody else (opened without
//! following a symbolic link). For every caller the file is opened without blocking (a FIFO
//! cannot hang `C_Initialize`), must be a regular file of at most [`MAX_CONFIG`] bytes (not
//! `/dev/zero`), and a parse error names only its line, never the file's content.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default config file; the only one read in a secure-execution process.
pub(crate) const DEFAULT_CONFIG: &str = "/etc/tpm-vault/pkcs11.toml";

/// The largest config file read (it holds a few short settings).
pub(crate) const MAX_CONFIG: u64 = 64 * 1024;

/// The module's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The daemon's Unix socket.
    pub(crate) socket: PathBuf,
    /// Token label (at most 32 bytes are shown; PKCS#11 pads it with spaces).
    pub(crate) token_label: String,
    /// Whether `C_DestroyObject` may delete a vault key. Off by default: a generic PKCS#11 UI
    /// would otherwise delete a TPM key for good with one click.
    pub(crate) allow_destroy: bool,
    /// Whether `CKM_RSA_PKCS` signs a SHA-1 DigestInfo (legacy callers only; refused by default).
    pub(crate) allow_sha1_digest_info: bool,
}

/// The config file's contents; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The daemon's socket.
    socket: Option<PathBuf>,
    /// Token label.
    token_label: Option<String>,
    /// `C_DestroyObject` deletes keys.
    allow_destroy: Option<bool>,
    /// SHA-1 DigestInfo for `CKM_RSA_PKCS`.
    allow_sha1_digest_info: Option<bool>,
}

/// True in a secure-execution process: the kernel set `AT_SECURE` (setuid, setgid, file
/// capabilities), or the real and effective uid or gid differ now.
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
pub(crate) fn secure_execution() -> bool {
    // SAFETY: getauxval and the id getters take no pointers and cannot fail.
    let (at_secure, uid, euid, gid, egid) =
        unsafe { (libc::getauxval(libc::AT_SECURE), libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid()) };
    at_secure != 0 || uid != euid || gid != egid
}

/// True while the real and effective uid differ (a setuid program, or one that set only its
/// effective uid): the module then refuses to sign.
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
pub(crate) fn uids_differ() -> bool {
    // SAFETY: as above.
    unsafe { libc::getuid() != libc::geteuid() }
}

impl Config {
    /// Reads the settings from the environment, the config file and the defaults.
    ///
    /// # Errors
    /// A message naming the config file when it exists but cannot be read or parsed (a
    /// missing default file is no error).
    pub(crate) fn load() -> Result<Config, String> {
        Config::load_as(secure_execution())
    }

    /// [`Config::load`], ignoring the environment when `secure`.
    fn load_as(secure: bool) -> Result<Config, String> {
        let env = |name: &str| if secure { None } else { std::env::var_os(name).filter(|v| !v.is_empty()) };
        let explicit = env("TPM_VAULT_PKCS11_CONFIG").map(PathBuf::from);
        let path = explicit.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        let file = match read(&path, secure)? {
            Some(text) => parse(&path, &text)?,
            None if explicit.is_none() => File::default(),
            None => return Err(format!("{}: no such file", path.display())),
        };
        let socket = env("TPM_VAULT_SOCKET")
            .map(PathBuf::from)
            .or(file.socket)
            .unwrap_or_else(|| PathBuf::from(tpm_vault_client::DEFAULT_SOCKET));
        let token_label = env("TPM_VAULT_PKCS11_TOKEN_LABEL")
            .and_then(|v| v.into_string().ok())
            .or(file.token_label)
            .unwrap_or_else(host_name);
        Ok(Config {
            socket,
            token_label,
            allow_destroy: file.allow_destroy.unwrap_or(false),
            allow_sha1_digest_info: file.allow_sha1_digest_info.unwrap_or(false),
        })
    }
}

/// The text of the config file at `path`; `None` if there is none.
///
/// # Errors
/// Not a regular file, too large, unreadable, not UTF-8; when `secure`, also a symbolic link
/// or a file not owned by root or writable by others.
fn read(path: &Path, secure: bool) -> Result<Option<String>, String> {
    let fail = |why: &str| Err(format!("{}: {why}", path.display()));
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if secure {
        flags |= libc::O_NOFOLLOW;
    }
    let mut file = match std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return fail(&format!("cannot open: {}", e.kind())),
    };
    let meta = file.metadata().map_err(|e| format!("{}: {}", path.display(), e.kind()))?;
    if !meta.file_type().is_file() {
        return fail("not a regular file");
    }
    if meta.len() > MAX_CONFIG {
        return fail(&format!("larger than {MAX_CONFIG} bytes"));
    }
    if secure && (meta.uid() != 0 || meta.mode() & 0o022 != 0) {
        return fail("not owned by root, or writable by others: ignored in a setuid/setgid program");
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_CONFIG + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {}", path.display(), e.kind()))?;
    if bytes.len() as u64 > MAX_CONFIG {
        return fail(&format!("larger than {MAX_CONFIG} bytes"));
    }
    String::from_utf8(bytes).map(Some).or_else(|_| fail("not UTF-8"))
}

/// Parses the file; an error names the line only (toml's messages quote the file's text,
/// which a setuid program must not print).
fn parse(path: &Path, text: &str) -> Result<File, String> {
    toml::from_str::<File>(text).map_err(|e| {
        let line = e.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        match line {
            Some(line) => format!("{}: line {line}: not a valid setting", path.display()),
            None => format!("{}: not a valid settings file", path.display()),
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)] // libc calls, each with its SAFETY note
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read(&fifo, false).unwrap_err().contains("not a regular file"));
        assert!(read(Path::new("/dev/zero"), false).unwrap_err().contains("not a regular file"));
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG as usize + 1]).unwrap();
        assert!(read(&big, false).unwrap_err().contains("larger than"));
        assert_eq!(read(&dir.path().join("none"), false), Ok(None));
    }

    #[test]
    fn parse_errors_never_quote_the_file() {
        let secret = "root-only-secret-value";
        for text in [format!("socket = \"/x\"\n{secret}\n"), format!("{secret} = 1\n"), format!("socket = {secret}\n")]
        {
            let e = parse(Path::new("/etc/f"), &text).err().unwrap();
            assert!(!e.contains(secret) && !e.contains("root-only"), "{e}");
            assert!(e.starts_with("/etc/f: line "), "{e}");
        }
    }

    #[test]
    fn secure_execution_reads_only_a_root_owned_default_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pkcs11.toml");
        std::fs::write(&path, "socket = \"/tmp/planted.sock\"\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(read(&path, true).unwrap_err().contains("ignored in a setuid"));
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read(&link, true).is_err());
        assert!(read(&link, false).unwrap().is_some());
    }

    #[test]
    fn the_shipped_files_parse() {
        let f = parse(Path::new("pkcs11.toml"), include_str!("../pkcs11.toml")).unwrap();
        assert_eq!((f.socket, f.allow_destroy, f.allow_sha1_digest_info), (None, None, None));
        // The p11-kit file loads the module only in the programs it is meant for.
        let module = include_str!("../tpm-vault.module");
        assert!(module.lines().any(|l| l.starts_with("enable-in:") && l.contains("p11tool")), "{module}");
    }

    #[test]
    fn the_new_switches_default_to_off() {
        let f = parse(Path::new("f"), "").unwrap();
        assert_eq!((f.allow_destroy, f.allow_sha1_digest_info), (None, None));
        let f = parse(Path::new("f"), "allow_destroy = true\nallow_sha1_digest_info = true\n").unwrap();
        assert_eq!((f.allow_destroy, f.allow_sha1_digest_info), (Some(true), Some(true)));
    }
}
