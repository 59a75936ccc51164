//! `tpm-vault ssh-agent`: an OpenSSH agent for the vault's keys (see [`crate::ssh_agent`]).
//!
//! Owns the socket: created 0600 (0660 with `--group`) under a tight umask so it is never
//! reachable by others even for a moment, or taken from systemd (`LISTEN_FDS`), and removed on
//! SIGTERM / SIGINT.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use clap::Args;

use crate::ssh_agent::{self, AgentConfig, VaultAgent};
use tpm_vault_client::Error;

use super::error::CliError;
use super::Context;

/// Shown at the end of `tpm-vault ssh-agent --help`.
const SSH_AGENT_HELP: &str = "\
The keys live in the vault: the agent lists the keys with the `ssh` usage that this user may
see (ECDSA P-256/P-384 and RSA) and signs each request through tpm-vaultd under this user's
identity, so the access policy and the audit log apply. The daemon signs with an `ssh` key only
what parses as an SSH user-authentication request for it or an SSHSIG blob (`ssh-keygen -Y
sign`): never a TLS handshake, a certificate or a policy approval. `ssh-add` of a key,
`ssh-add -d/-D` and locking are refused with SSH_AGENT_FAILURE: create and delete keys with
`tpm-vault key` (`key create NAME --usage ssh`).

Forwarding (`ssh -A`) lets the remote host, and anyone who is root there, sign with your keys
for as long as you are logged in. OpenSSH (8.9 and later) tells the agent when a connection is
forwarded (session-bind@openssh.com); the agent then refuses to sign unless --allow-forwarding.
Prefer `ssh -J` (ProxyJump) to forwarding.

Every connection's peer (pid, uid, gid) is logged on stderr.

Use it:
  tpm-vault key create me --usage ssh
  tpm-vault ssh-agent --listen \"$XDG_RUNTIME_DIR/tpm-vault-ssh-agent.sock\" &
  export SSH_AUTH_SOCK=\"$XDG_RUNTIME_DIR/tpm-vault-ssh-agent.sock\"
  ssh-add -L";

/// Serve the vault's keys to ssh, ssh-keygen and sshd over the OpenSSH agent protocol
#[derive(Debug, Args)]
#[command(after_help = SSH_AGENT_HELP)]
pub(crate) struct SshAgentArgs {
    /// The agent's socket [default: $XDG_RUNTIME_DIR/tpm-vault-ssh-agent.sock; under systemd
    /// socket activation the passed socket]. The daemon's socket is the global --socket.
    #[arg(long, short = 'a', value_name = "PATH", env = "TPM_VAULT_SSH_AGENT_SOCKET")]
    listen: Option<PathBuf>,
    /// Serve only `ssh` keys whose name matches GLOB (`*`, `?`); repeatable
    ///
    /// A key without the `ssh` usage is served only when a --keys value is its exact name (no
    /// wildcard), and then for raw signatures of whatever the agent is sent (it needs the
    /// `sign` usage): for a host key that sshd reads through HostKeyAgent. Run that agent for
    /// sshd alone.
    #[arg(long, value_name = "GLOB", default_value = "*")]
    keys: Vec<String>,
    /// Also offer the OpenSSH certificate FILE (made by `ssh-keygen -s`) for key NAME; repeatable
    #[arg(long, value_name = "NAME=FILE")]
    cert: Vec<String>,
    /// Create the socket 0660 for this group (default: 0600, this user only)
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Also sign SHA-1 `ssh-rsa` requests with RSA keys (refused by default)
    #[arg(long)]
    allow_ssh_rsa_sha1: bool,
    /// Also sign on forwarded connections (`ssh -A`; refused by default: the remote host could
    /// then sign with your keys)
    #[arg(long)]
    allow_forwarding: bool,
}

impl SshAgentArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let certs = load_certs(&self.cert)?;
        let client = ctx.client().await?;
        let (listener, created) = self.bind_socket()?;
        let config = AgentConfig {
            keys: self.keys,
            certs,
            allow_sha1: self.allow_ssh_rsa_sha1,
            allow_forwarding: self.allow_forwarding,
        };
        let agent = VaultAgent::new(client, config);
        let shutdown = super::terminated();
        let result = ssh_agent::serve(agent, listener, shutdown).await;
        if let Some(path) = &created {
            let _ = std::fs::remove_file(path);
        }
        let path = created.unwrap_or_else(|| PathBuf::from("LISTEN_FDS"));
        result.map_err(|source| CliError::Io { action: "accept on", path, source })
    }

    /// The listening socket: systemd's, or a new one at `--listen`. Returns the path to remove
    /// on exit when this process created it.
    fn bind_socket(&self) -> Result<(tokio::net::UnixListener, Option<PathBuf>), CliError> {
        let activated = || -> io::Result<Option<std::os::unix::net::UnixListener>> {
            listenfd::ListenFd::from_env().take_unix_listener(0)
        };
        if self.listen.is_none() {
            let fd = activated().map_err(listen_error(Path::new("LISTEN_FDS")))?;
            if let Some(listener) = fd {
                listener.set_nonblocking(true).map_err(listen_error(Path::new("LISTEN_FDS")))?;
                let listener =
                    tokio::net::UnixListener::from_std(listener).map_err(listen_error(Path::new("LISTEN_FDS")))?;
                return Ok((listener, None));
            }
        }
        let path = match &self.listen {
            Some(path) => path.clone(),
            None => match std::env::var_os("XDG_RUNTIME_DIR") {
                Some(dir) => PathBuf::from(dir).join("tpm-vault-ssh-agent.sock"),
                None => {
                    return Err(
                        Error::InvalidInput("no --listen PATH given and XDG_RUNTIME_DIR is not set".into()).into()
                    )
                }
            },
        };
        let gid = match &self.group {
            Some(name) => Some(
                nix::unistd::Group::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| Error::InvalidInput(format!("no such group: {name}")))?
                    .gid,
            ),
            None => None,
        };
        remove_stale(&path)?;
        // The socket is born 0600: no moment in which another user could connect.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
        let bound = std::os::unix::net::UnixListener::bind(&path);
        nix::sys::stat::umask(old);
        let listener = bound.map_err(listen_error(&path))?;
        if let Some(gid) = gid {
            nix::unistd::chown(&path, None, Some(gid)).map_err(|e| listen_error(&path)(e.into()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).map_err(listen_error(&path))?;
        }
        listener.set_nonblocking(true).map_err(listen_error(&path))?;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(listen_error(&path))?;
        eprintln!("tpm-vault ssh-agent: listening on {}", path.display());
        Ok((listener, Some(path)))
    }
}

/// A failure to create or use the agent's socket.
fn listen_error(path: &Path) -> impl FnOnce(io::Error) -> CliError + '_ {
    move |source| CliError::Io { action: "listen on", path: path.to_path_buf(), source }
}

/// Removes a socket left by an agent that is gone; refuses when one still answers or the path
/// is not a socket.
fn remove_stale(path: &Path) -> Result<(), CliError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    let in_use = |why: &str| listen_error(path)(io::Error::new(io::ErrorKind::AddrInUse, why.to_owned()));
    if !meta.file_type().is_socket() {
        return Err(in_use("exists and is not a socket"));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(in_use("another agent is listening there"));
    }
    std::fs::remove_file(path).map_err(listen_error(path))
}

/// Parses `NAME=FILE` pairs and reads each file's OpenSSH certificate.
fn load_certs(pairs: &[String]) -> Result<HashMap<String, Vec<ssh_agent_lib::ssh_key::Certificate>>, CliError> {
    let mut certs: HashMap<String, Vec<_>> = HashMap::new();
    for pair in pairs {
        let (name, file) =
            pair.split_once('=').ok_or_else(|| Error::InvalidInput(format!("--cert {pair:?}: expected NAME=FILE")))?;
        let path = Path::new(file);
        let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
        let cert = ssh_agent_lib::ssh_key::Certificate::from_openssh(text.trim())
            .map_err(|e| Error::InvalidInput(format!("{file}: not an OpenSSH certificate: {e}")))?;
        certs.entry(name.to_owned()).or_default().push(cert);
    }
    Ok(certs)
}
