//! An HTTPS server whose private key stays in the TPM: `GET /` answers 200.
//!
//! ```sh
//! tpm-vault key create web
//! tpm-vault cert self-sign web --subject CN=localhost --san dns:localhost > web.pem
//! cargo run -p tpm-vault-client --example tls_server -- --key web --listen 127.0.0.1:8443
//! curl --cacert web.pem https://localhost:8443/
//! ```
//!
//! Every handshake's CertificateVerify signature is made by the TPM through tpm-vaultd
//! ([`VaultSigningKey`](tpm_vault_client::tls::VaultSigningKey)); a certificate imported or
//! re-issued later is served within `--refresh-secs`, without a restart. TLS 1.3 only, key
//! exchange X25519MLKEM768, X25519, P-256. `--current-thread` serves on a current-thread tokio
//! runtime instead of a multi-thread one (both work: the signing client has its own thread).
//! The bound address is printed on stdout as `listening on https://ADDR`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tpm_vault_client::tls::{self, SigningClient, VaultCertResolver};
use tpm_vault_client::{ClientBuilder, DEFAULT_SOCKET};

/// Longest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// Time a client gets for its handshake and request.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The body of `GET /`.
const BODY: &str = "hello from a TPM-resident key\n";

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "tls_server", about = "HTTPS server whose private key stays in the TPM (via tpm-vaultd)")]
struct Args {
    /// Vault key name; the key must have a stored certificate chain
    #[arg(long, value_name = "NAME")]
    key: String,
    /// Address to listen on (port 0 picks a free one)
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// tpm-vaultd's Unix socket
    #[arg(long, value_name = "PATH", env = "TPM_VAULT_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Serve on a current-thread runtime instead of a multi-thread one
    #[arg(long)]
    current_thread: bool,
    /// Worker threads of the multi-thread runtime [default: one per CPU]
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// How often to check for a new certificate or key version, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    refresh_secs: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The signing client's thread and runtime are started here, outside any runtime.
    let signer = SigningClient::connect_blocking(ClientBuilder::new(&args.socket))
        .with_context(|| format!("connecting to tpm-vaultd at {}", args.socket.display()))?;
    let runtime = if args.current_thread {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = args.workers {
            builder.worker_threads(n.max(1));
        }
        builder.enable_all().build()?
    };
    runtime.block_on(serve(args, signer))
}

async fn serve(args: Args, signer: SigningClient) -> anyhow::Result<()> {
    let resolver = VaultCertResolver::new(&signer, &args.key, Duration::from_secs(args.refresh_secs))
        .await
        .with_context(|| format!("loading the certificate of key {}", args.key))?;
    let mut config = tls::server_config(Arc::new(resolver))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on https://{}", listener.local_addr()?)?;
    stdout.flush()?;
    drop(stdout);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(CLIENT_TIMEOUT, handle(acceptor, tcp))
                .await
                .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client too slow")))
            {
                if std::env::var_os("TLS_SERVER_VERBOSE").is_some() {
                    eprintln!("{peer}: {e}");
                }
            }
        });
    }
}

/// One connection: handshake, read one request head, answer, close.
async fn handle(acceptor: TlsAcceptor, tcp: TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let mut tls = acceptor.accept(tcp).await?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut chunk).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            // A handshake-only client (openssl s_time) or an oversize request.
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let (status, body) = if head.starts_with(b"GET / ") { ("200 OK", BODY) } else { ("404 Not Found", "not found\n") };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(response.as_bytes()).await?;
    tls.shutdown().await
}
