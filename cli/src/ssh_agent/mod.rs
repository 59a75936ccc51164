//! An OpenSSH agent (draft-ietf-sshm-ssh-agent) for the vault's keys: `tpm-vault ssh-agent`.
//!
//! The agent holds no key material. Listing asks the daemon for the keys the agent's user may
//! see (and their public keys); each sign request becomes one vault `Sign` call under the
//! agent's uid, so the daemon's access policy and audit log apply to every SSH signature.
//!
//! The agent is not a signing oracle. It serves keys with the `ssh` usage, and signs with them
//! as SSH signatures (`SignPurpose::Ssh`): the daemon signs only data that parses as an SSH
//! user-authentication request for that key or an SSHSIG blob, never a TLS handshake or a
//! policy approval. A key without the `ssh` usage is served only when `--keys` names it exactly
//! (no wildcard), for raw signatures (it needs the `sign` usage), as sshd's `HostKeyAgent`
//! needs for a host key. A connection that `session-bind@openssh.com` marks as forwarded (`ssh
//! -A`: the agent used from another host) gets no signature unless `allow_forwarding`; a bind
//! that does not parse counts as forwarded. Every connection's peer (pid, uid, gid from
//! `SO_PEERCRED`) is logged.
//! Keys: ECDSA P-256 / P-384 (`ecdsa-sha2-nistp256/384`) and RSA (`rsa-sha2-256/512`; SHA-1
//! `ssh-rsa` only when allowed). OpenSSH certificates given with [`AgentConfig::certs`] are
//! offered beside their keys.
//!
//! The message types and key formats are `ssh-agent-lib` / `ssh-key`'s; this module owns the
//! connection loop (see [`serve_connection`]) so that a bounded frame size applies and every
//! malformed message gets `SSH_AGENT_FAILURE` rather than a dropped connection. Adding and
//! removing identities, smartcard keys and locking are refused with `SSH_AGENT_FAILURE`: the
//! keys live in the vault.

pub mod keys;

use std::collections::HashMap;
use std::sync::Arc;

use ssh_agent_lib::proto::extension::SessionBind;
use ssh_agent_lib::proto::{Extension, Identity, PublicCredential, Request, Response, SignRequest};
use ssh_agent_lib::ssh_encoding::{Decode as _, Encode as _, Reader as _};
use ssh_agent_lib::ssh_key::public::KeyData;
use ssh_agent_lib::ssh_key::Certificate;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::Mutex;

use tpm_vault_client::{Client, KeyAlgorithm, KeyUsage, SignInput, SignPurpose};

pub use keys::KeyFormatError;

/// The largest agent message accepted (OpenSSH's `AGENT_MAX_LEN`, 256 KiB). A longer length
/// prefix closes the connection: the message cannot be skipped without reading it.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// `SSH_AGENT_FAILURE` as a whole frame.
const FAILURE_FRAME: [u8; 5] = [0, 0, 0, 1, 5];

/// What the agent serves.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Key-name globs; a key with the `ssh` usage is served when its name matches one of them.
    /// A key without it is served (for raw signatures) only when one of them is its exact name.
    pub keys: Vec<String>,
    /// OpenSSH certificates, by key name, offered (after the plain key) for that key.
    pub certs: HashMap<String, Vec<Certificate>>,
    /// Sign SHA-1 `ssh-rsa` requests (RSA requests without the SHA-2 flags).
    pub allow_sha1: bool,
    /// Sign on connections that `session-bind@openssh.com` marks as forwarded (`ssh -A`).
    pub allow_forwarding: bool,
}

impl Default for AgentConfig {
    fn default() -> AgentConfig {
        AgentConfig { keys: vec!["*".into()], certs: HashMap::new(), allow_sha1: false, allow_forwarding: false }
    }
}

/// What one agent connection has said about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    /// A `session-bind@openssh.com` marked it as forwarded (or did not parse): the peer may be
    /// a remote host using a forwarded agent.
    pub forwarded: bool,
    /// A verified bind for user authentication (not forwarding) was made: OpenSSH's agent
    /// refuses any later bind on such a connection, and so does this one.
    pub bound_for_auth: bool,
}

/// One served vault key.
#[derive(Clone, Debug)]
struct Served {
    /// Vault key name.
    name: String,
    /// Its algorithm.
    algorithm: KeyAlgorithm,
    /// Its OpenSSH key blob.
    key: KeyData,
    /// `Ssh` for a key with the `ssh` usage; `Unspecified` (raw) for a key named exactly by
    /// `--keys` without it.
    purpose: SignPurpose,
}

/// The agent: a vault client and what to serve. Cheap to clone; clones share the key cache.
#[derive(Clone, Debug)]
pub struct VaultAgent {
    client: Client,
    config: Arc<AgentConfig>,
    /// The keys as last listed, so that a sign request needs one daemon call.
    cache: Arc<Mutex<Vec<Served>>>,
}

impl VaultAgent {
    /// An agent using `client` (the daemon connection) and serving what `config` says.
    pub fn new(client: Client, config: AgentConfig) -> VaultAgent {
        VaultAgent { client, config: Arc::new(config), cache: Arc::default() }
    }

    /// Lists the served keys from the daemon (those this user may see and whose public key it
    /// may read) and refreshes the cache.
    async fn refresh(&self) -> Result<Vec<Served>, tpm_vault_client::Error> {
        let mut served = Vec::new();
        for info in self.client.list_keys().await? {
            let purpose = if info.allows(KeyUsage::Ssh) {
                if !self.config.keys.iter().any(|g| keys::glob_match(g, &info.name)) {
                    continue;
                }
                SignPurpose::Ssh
            } else if self.config.keys.iter().any(|g| g == &info.name) && info.allows(KeyUsage::Sign) {
                SignPurpose::Unspecified
            } else {
                continue;
            };
            if info.algorithm.info().is_none_or(|a| a.ssh_key_type.is_none()) {
                continue;
            }
            // A key whose public part this user may not read is not listed (and cannot be used).
            let Ok(public) = self.client.public_key(&info.name).await else { continue };
            match keys::key_data(info.algorithm, &public.der) {
                Ok(key) => served.push(Served { name: info.name, algorithm: info.algorithm, key, purpose }),
                Err(e) => log_line(&format!("key {}: {e}", info.name)),
            }
        }
        *self.cache.lock().await = served.clone();
        Ok(served)
    }

    /// The agent's identities: each served key, then its certificates (those from the config
    /// and any OpenSSH certificate line in the key's stored chain).
    pub async fn identities(&self) -> Result<Vec<Identity>, tpm_vault_client::Error> {
        let mut out = Vec::new();
        for key in self.refresh().await? {
            out.push(Identity { credential: PublicCredential::Key(key.key.clone()), comment: key.name.clone() });
            for cert in self.certificates(&key).await {
                out.push(Identity { credential: PublicCredential::Cert(Box::new(cert)), comment: key.name.clone() });
            }
        }
        Ok(out)
    }

    /// The certificates offered for `key` whose public key is the key's own.
    async fn certificates(&self, key: &Served) -> Vec<Certificate> {
        let mut certs = self.config.certs.get(&key.name).cloned().unwrap_or_default();
        if let Ok(chain) = self.client.certificate(&key.name).await {
            certs.extend(chain.chain_pem.lines().filter_map(|l| Certificate::from_openssh(l.trim()).ok()));
        }
        certs.retain(|c| c.public_key() == &key.key);
        certs
    }

    /// The served key whose blob is `blob`, from the cache or else a fresh listing.
    async fn find(&self, blob: &KeyData) -> Option<Served> {
        if let Some(found) = self.cache.lock().await.iter().find(|k| &k.key == blob) {
            return Some(found.clone());
        }
        self.refresh().await.ok()?.into_iter().find(|k| &k.key == blob)
    }

    /// Signs an agent request through the vault. `None` (→ `SSH_AGENT_FAILURE`) for an unknown
    /// key, a refused algorithm or a vault refusal (which the daemon audits).
    async fn sign(&self, request: SignRequest) -> Option<ssh_agent_lib::ssh_key::Signature> {
        let Some(key) = self.find(request.credential.key_data()).await else {
            log_line("sign: no such key in this agent");
            return None;
        };
        let (options, algorithm) = match keys::sign_plan(key.algorithm, request.flags, self.config.allow_sha1) {
            Ok(plan) => plan,
            Err(e) => {
                log_line(&format!("sign with {}: {e}", key.name));
                return None;
            }
        };
        let options = options.with_purpose(key.purpose);
        match self.client.sign(&key.name, SignInput::Message(request.data), &options).await {
            Ok(sig) => match keys::ssh_signature(algorithm, sig.bytes()) {
                Ok(sig) => Some(sig),
                Err(e) => {
                    log_line(&format!("sign with {}: {e}", key.name));
                    None
                }
            },
            Err(e) => {
                log_line(&format!("sign with {}: {e}", key.name));
                None
            }
        }
    }

    /// The answer to one decoded request on a connection in state `connection` (which a
    /// `session-bind@openssh.com` updates), from `peer` (for the log).
    pub async fn handle(&self, request: Request, connection: &mut Connection, peer: &str) -> Response {
        match request {
            Request::RequestIdentities => match self.identities().await {
                Ok(ids) => Response::IdentitiesAnswer(ids),
                Err(e) => {
                    log_line(&format!("list keys: {e}"));
                    Response::Failure
                }
            },
            Request::SignRequest(_) if connection.forwarded && !self.config.allow_forwarding => {
                log_line(&format!(
                    "sign refused: {peer} is a forwarded connection (session-bind is-forwarding; \
                     --allow-forwarding allows it)"
                ));
                Response::Failure
            }
            Request::SignRequest(request) => match self.sign(request).await {
                Some(sig) => Response::SignResponse(sig),
                None => Response::Failure,
            },
            Request::Extension(extension) => handle_extension(&extension, connection, peer),
            // Keys live in the vault: adding, removing and locking are refused.
            _ => Response::Failure,
        }
    }
}

/// `session-bind@openssh.com` is accepted when its host signature checks, and marks the
/// connection forwarded when it says so (whether or not it checks: the mark only takes
/// away) or when it does not parse at all; `query` lists it; other extensions are unsupported
/// (`SSH_AGENT_FAILURE`, as the draft says).
fn handle_extension(extension: &Extension, connection: &mut Connection, peer: &str) -> Response {
    match extension.name.as_str() {
        "session-bind@openssh.com" => {
            let forwarding = bind_is_forwarding(extension.details.as_ref());
            if forwarding != Some(false) && !connection.forwarded {
                log_line(&format!("{peer}: forwarded connection (session-bind is-forwarding)"));
            }
            connection.forwarded |= forwarding != Some(false);
            if connection.bound_for_auth {
                log_line(&format!("{peer}: refused a second session-bind on a connection bound for authentication"));
                return Response::Failure;
            }
            match extension.details.parse::<SessionBind>() {
                Ok(bind) if bind.verify_signature().is_ok() => {
                    connection.bound_for_auth = !bind.is_forwarding;
                    Response::Success
                }
                _ => Response::Failure,
            }
        }
        "query" => {
            let mut details = Vec::new();
            if "session-bind@openssh.com".encode(&mut details).is_err() {
                return Response::Failure;
            }
            Response::ExtensionResponse(Extension { name: "query".into(), details: details.into() })
        }
        _ => Response::Failure,
    }
}

/// The is-forwarding flag of a `session-bind@openssh.com` body (string host key, string
/// session id, string signature, boolean), read without parsing the key or the signature, so
/// a key type this agent cannot verify still counts; `None` when the body is not that shape.
pub fn bind_is_forwarding(details: &[u8]) -> Option<bool> {
    let mut rest = details;
    for _ in 0..3 {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        rest = rest.get(4..)?.get(len..)?;
    }
    match rest {
        [flag] => Some(*flag != 0),
        _ => None,
    }
}

/// Decodes one message body; `None` when it is malformed or has trailing bytes.
pub fn decode_request(body: &[u8]) -> Option<Request> {
    let mut reader = body;
    let request = Request::decode(&mut reader).ok()?;
    (reader.remaining_len() == 0).then_some(request)
}

/// Serves one agent connection from `peer` (a description for the log) until the peer closes
/// it, a length prefix exceeds [`MAX_MESSAGE`], or an I/O error. Malformed messages get
/// `SSH_AGENT_FAILURE`.
pub async fn serve_connection<S>(agent: &VaultAgent, mut stream: S, peer: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut connection = Connection::default();
    loop {
        let mut len = [0u8; 4];
        if stream.read_exact(&mut len).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_MESSAGE {
            log_line(&format!("closing a connection: message length {len} over {MAX_MESSAGE}"));
            return;
        }
        let mut body = vec![0u8; len];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        let frame = match decode_request(&body) {
            Some(request) => encode_response(&agent.handle(request, &mut connection, peer).await),
            None => FAILURE_FRAME.to_vec(),
        };
        if stream.write_all(&frame).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// A response as a length-prefixed frame (`SSH_AGENT_FAILURE` if it cannot be encoded).
fn encode_response(response: &Response) -> Vec<u8> {
    let mut body = Vec::new();
    if response.encode(&mut body).is_err() || body.len() > MAX_MESSAGE {
        return FAILURE_FRAME.to_vec();
    }
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Accepts connections on `listener` until `shutdown` completes, each served on its own task.
///
/// # Errors
/// When accepting fails for a reason other than a transient one.
pub async fn serve(
    agent: VaultAgent,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let peer = match stream.peer_cred() {
                        Ok(c) => format!(
                            "pid {} uid {} gid {}",
                            c.pid().map_or_else(|| "?".to_owned(), |p| p.to_string()),
                            c.uid(),
                            c.gid()
                        ),
                        Err(e) => format!("a peer without credentials ({e})"),
                    };
                    log_line(&format!("connection from {peer}"));
                    let agent = agent.clone();
                    tokio::spawn(async move { serve_connection(&agent, stream, &peer).await });
                }
                Err(e) if is_transient(&e) => {
                    log_line(&format!("accept: {e}"));
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            },
        }
    }
}

/// Accept errors that pass (out of descriptors, an aborted connection).
fn is_transient(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted)
        || matches!(e.raw_os_error(), Some(23 | 24))
}

/// One diagnostic line on stderr (the journal under systemd).
fn log_line(message: &str) {
    eprintln!("tpm-vault ssh-agent: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_messages_do_not_decode() {
        assert!(decode_request(&[]).is_none());
        assert!(decode_request(&[200]).is_none());
        assert!(decode_request(&[11, 0]).is_none(), "trailing byte");
        assert!(decode_request(&[13, 0, 0, 0, 9, 1]).is_none(), "truncated sign request");
        assert!(matches!(decode_request(&[11]), Some(Request::RequestIdentities)));
    }

    #[test]
    fn session_bind_forwarding_flag() {
        let string = |b: &[u8]| {
            let mut v = (b.len() as u32).to_be_bytes().to_vec();
            v.extend_from_slice(b);
            v
        };
        let mut body = [string(b"hostkey"), string(&[1; 32]), string(b"signature")].concat();
        assert_eq!(bind_is_forwarding(&body), None, "no flag");
        body.push(1);
        assert_eq!(bind_is_forwarding(&body), Some(true));
        *body.last_mut().unwrap() = 0;
        assert_eq!(bind_is_forwarding(&body), Some(false));
        body.push(0);
        assert_eq!(bind_is_forwarding(&body), None, "trailing byte");
        assert_eq!(bind_is_forwarding(&[0, 0, 0, 9, 1]), None);
        assert_eq!(bind_is_forwarding(&[]), None);
    }

    /// A bind that says forwarding marks the connection even when its signature does not check
    /// (here: garbage host key), and one that does not parse counts as forwarded.
    #[test]
    fn forwarding_marks_stick_and_fail_closed() {
        let string = |b: &[u8]| {
            let mut v = (b.len() as u32).to_be_bytes().to_vec();
            v.extend_from_slice(b);
            v
        };
        let bind = |details: Vec<u8>| Extension { name: "session-bind@openssh.com".into(), details: details.into() };
        let mut c = Connection::default();
        let mut forwarded = [string(b"hostkey"), string(&[1; 32]), string(b"signature")].concat();
        forwarded.push(1);
        assert!(matches!(handle_extension(&bind(forwarded), &mut c, "test"), Response::Failure));
        assert!(c.forwarded);
        let mut not_forwarded = [string(b"hostkey"), string(&[1; 32]), string(b"signature")].concat();
        not_forwarded.push(0);
        handle_extension(&bind(not_forwarded.clone()), &mut c, "test");
        assert!(c.forwarded, "the mark stays");
        let mut fresh = Connection::default();
        handle_extension(&bind(not_forwarded), &mut fresh, "test");
        assert!(!fresh.forwarded);
        handle_extension(&bind(vec![0, 0, 0, 1, 0]), &mut fresh, "test");
        assert!(fresh.forwarded, "a bind that does not parse counts as forwarded");
    }

    #[test]
    fn failure_frame() {
        assert_eq!(encode_response(&Response::Failure), FAILURE_FRAME);
    }
}
