//! The SSH agent (issue #23): ECDSA P-256 signatures per second through the real `tpm-vault
//! ssh-agent` socket, at 1 and 8 concurrent clients ([`LEVELS`]), against the daemon's gRPC
//! `Sign` of the same key at the same concurrency, in the same round on the same daemon.
//!
//! Each agent client is a connection of its own speaking the OpenSSH agent protocol with
//! `ssh-agent-lib`'s message types: it lists the identities once, then sends
//! `SSH_AGENTC_SIGN_REQUEST`s for a 32-byte challenge in a loop, and every answer must be a
//! signature. The peer is what the agent itself asks of the daemon for each request: one
//! client-library `Client::sign` of the message (SHA-256 in the daemon) per request, a client
//! (a connection) per concurrent caller. The first signature of each path is verified.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use ssh_agent_lib::proto::{PublicCredential, Request, Response, SignRequest};
use ssh_agent_lib::ssh_encoding::{Decode as _, Encode as _};
use ssh_agent_lib::ssh_key::public::KeyData;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, SignInput, SignOptions};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use crate::sign::{Timing, KEY_NAME};
use crate::tls_peers::stop_child;

/// Concurrent clients measured.
pub const LEVELS: [usize; 2] = [1, 8];

/// The challenge every request signs (the size of an SSH session hash).
const CHALLENGE: [u8; 32] = *b"tpm-vault agent benchmark 32 B!!";

/// One concurrency level.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentLevel {
    /// Concurrent clients.
    pub clients: usize,
    /// Signatures/s through the agent socket.
    pub agent: f64,
    /// Signatures/s through the daemon's gRPC `Sign`.
    pub grpc: f64,
}

/// One round of the phase.
#[derive(Debug, Clone, Default)]
pub struct AgentRound {
    /// Per [`LEVELS`] entry.
    pub levels: Vec<AgentLevel>,
}

/// A running `tpm-vault ssh-agent`, stopped on drop.
struct Agent {
    child: Child,
    socket: PathBuf,
}

impl Agent {
    /// Starts the agent for the daemon at `daemon` on a socket in `dir`, serving [`KEY_NAME`].
    fn start(binary: &Path, daemon: &Path, dir: &Path) -> Result<Agent> {
        let socket = dir.join("agent.sock");
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(binary)
            .close_inherited_fds()
            .arg("--socket")
            .arg(daemon)
            .args(["ssh-agent", "--keys", KEY_NAME, "--listen"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} ssh-agent", binary.display()))?;
        let mut agent = Agent { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.socket.exists() {
            if let Some(status) = agent.child.try_wait()? {
                bail!("tpm-vault ssh-agent exited with {status} before listening");
            }
            ensure!(Instant::now() < deadline, "tpm-vault ssh-agent did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(agent)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(2));
    }
}

/// One agent connection.
struct AgentClient {
    stream: UnixStream,
    key: KeyData,
}

impl AgentClient {
    /// Connects and finds [`KEY_NAME`] among the identities.
    async fn connect(socket: &Path) -> Result<AgentClient> {
        let mut stream =
            UnixStream::connect(socket).await.with_context(|| format!("connecting to {}", socket.display()))?;
        let Response::IdentitiesAnswer(ids) = exchange(&mut stream, &Request::RequestIdentities).await? else {
            bail!("the agent did not list its identities");
        };
        let id = ids.into_iter().find(|i| i.comment == KEY_NAME).context("the agent does not offer the bench key")?;
        Ok(AgentClient { stream, key: id.credential.key_data().clone() })
    }

    /// One signature of [`CHALLENGE`].
    async fn sign(&mut self) -> Result<ssh_agent_lib::ssh_key::Signature> {
        let request = Request::SignRequest(SignRequest {
            credential: PublicCredential::Key(self.key.clone()),
            data: CHALLENGE.to_vec(),
            flags: 0,
        });
        match exchange(&mut self.stream, &request).await? {
            Response::SignResponse(sig) => Ok(sig),
            other => bail!("the agent answered a sign request with {other:?}"),
        }
    }
}

/// Checks an agent signature of [`CHALLENGE`] (`ecdsa-sha2-nistp256`: r and s as mpints) with
/// the key the agent listed, in aws-lc-rs.
fn verify(key: &KeyData, sig: &ssh_agent_lib::ssh_key::Signature) -> Result<()> {
    use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
    use ssh_agent_lib::ssh_key::Mpint;
    let KeyData::Ecdsa(ecdsa) = key else { bail!("the bench key is not an ECDSA key in the agent") };
    let mut blob = sig.as_bytes();
    let mut fixed = [0u8; 64];
    for half in fixed.chunks_mut(32) {
        let n = Mpint::decode(&mut blob).context("an ECDSA signature blob")?;
        let bytes = n.as_positive_bytes().context("a negative ECDSA scalar")?;
        ensure!(bytes.len() <= 32, "an ECDSA scalar of {} bytes", bytes.len());
        half[32 - bytes.len()..].copy_from_slice(bytes);
    }
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, ecdsa.as_sec1_bytes())
        .verify(&CHALLENGE, &fixed)
        .map_err(|_| anyhow::anyhow!("the agent's signature does not verify"))
}

/// Sends one request frame and reads the response frame.
async fn exchange(stream: &mut UnixStream, request: &Request) -> Result<Response> {
    let mut body = Vec::new();
    request.encode(&mut body).context("encoding an agent request")?;
    let mut frame = u32::try_from(body.len()).context("request length")?.to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).await.context("writing to the agent")?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.context("reading the agent's answer")?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.context("reading the agent's answer")?;
    Response::decode(&mut body.as_slice()).context("decoding the agent's answer")
}

/// Signatures/s of `clients` concurrent loops of `op` over the window (completions inside it).
async fn concurrent<C, F, Fut>(clients: Vec<C>, timing: Timing, op: F) -> Result<f64>
where
    C: Send + 'static,
    F: Fn(C) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<C>> + Send,
{
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        tasks.spawn(async move {
            let (mut client, mut done) = (client, 0u64);
            while Instant::now() < t1 {
                client = op(client).await?;
                let end = Instant::now();
                if end >= t0 && end <= t1 {
                    done += 1;
                }
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.context("a client task panicked")??;
    }
    Ok(total as f64 / timing.window.as_secs_f64())
}

/// One round: the agent started on the daemon at `daemon`, then each level through the agent and
/// through gRPC.
///
/// # Errors
/// The agent failing to start, a failed or unverifiable signature.
pub fn run(binary: &Path, daemon: &Path, dir: &Path, timing: Timing, rt: &Runtime) -> Result<AgentRound> {
    let agent = Agent::start(binary, daemon, dir)?;
    rt.block_on(async {
        let grpc = Client::connect(daemon).await.context("connecting to the daemon")?;
        let mut first = AgentClient::connect(&agent.socket).await?;
        let sig = first.sign().await?;
        verify(&first.key, &sig).context("the agent's first signature")?;
        let peer = grpc.sign(KEY_NAME, SignInput::Message(CHALLENGE.to_vec()), &SignOptions::default()).await?;
        ensure!(!peer.bytes().is_empty(), "the daemon returned an empty signature");
        let mut levels = Vec::with_capacity(LEVELS.len());
        for clients in LEVELS {
            let mut conns = Vec::with_capacity(clients);
            for _ in 0..clients {
                conns.push(AgentClient::connect(&agent.socket).await?);
            }
            let agent_rate = concurrent(conns, timing, |mut c: AgentClient| async move {
                c.sign().await?;
                Ok(c)
            })
            .await?;
            let mut callers = Vec::with_capacity(clients);
            for _ in 0..clients {
                callers.push(Client::connect(daemon).await.context("connecting to the daemon")?);
            }
            let grpc_rate = concurrent(callers, timing, |c: Client| async move {
                c.sign(KEY_NAME, SignInput::Message(CHALLENGE.to_vec()), &SignOptions::default())
                    .await
                    .context("Sign RPC")?;
                Ok(c)
            })
            .await?;
            levels.push(AgentLevel { clients, agent: agent_rate, grpc: grpc_rate });
        }
        Ok(AgentRound { levels })
    })
}
