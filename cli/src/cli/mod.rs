//! The `tpm-vault` command line.
//!
//! Owns argument parsing (clap derive), output in text or JSON, and exit codes. Each command
//! lives in its own module as an `Args` struct (or a subcommand enum) with an
//! `async fn run(self, &mut Context)`; adding a command means adding a module and one arm to
//! `Command`. The binary (`src/main.rs`) only parses arguments, builds a runtime and
//! calls [`run`]. This module does not talk gRPC itself: it uses [`Client`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use tpm_vault_client::{Client, DEFAULT_SOCKET};

mod access;
mod acme;
mod attest;
mod cert;
mod completions;
mod crypto;
mod error;
mod eventlog;
mod files;
mod kem;
mod key;
mod keylime;
mod output;
mod password;
mod progress;
mod seal;
mod seal_for;
mod sign;
mod ssh_agent;
mod status;

use error::CliError;
use output::Report;

/// Exit statuses, shown at the end of `tpm-vault --help`.
const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  success
  1  failure, including \"Verification failure\", a rejected quote or SRK certification and a TPM the
     event log does not explain
  2  usage error or invalid argument (bad key name, digest length, scheme...)
  3  no such key (or, for eventlog and quote --with-eventlog, no event log on the device)
  4  a key with that name already exists
  5  permission denied by the access policy (or `access check` answered deny)
  6  PCR values do not match the key's or the sealed secret's binding
  7  daemon not running, TPM unreachable, or no answer in time (retry later)
  8  TPM busy, in dictionary-attack lockout, or password attempts held back (retry later)
  9  not allowed to open the daemon's socket (join the group the message names; do not retry)
 10  wrong key password
 11  the ACME CA refused (its problem is quoted) or could not be reached; the Keylime registrar
     refused this TPM for the agent's UUID
 12  verify-quote without --ak: the quote checks out, but its AK was not checked against an enrolled one";

/// `tpm-vault`: use the keys of a TPM 2.0 through the tpm-vaultd daemon.
#[derive(Debug, Parser)]
#[command(
    name = "tpm-vault",
    version,
    about = "Use TPM-resident keys through the tpm-vaultd daemon",
    propagate_version = true,
    arg_required_else_help = true,
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    /// Options that apply to every command.
    #[command(flatten, next_help_heading = "Global options")]
    global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// Options shared by all commands.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// The daemon's Unix socket
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "TPM_VAULT_SOCKET",
        default_value = DEFAULT_SOCKET
    )]
    socket: PathBuf,
    /// Output format: text for people, json (one object per command) for programs
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

/// How results are printed on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per command.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Show the daemon's and the TPM's state
    Status(status::StatusArgs),
    /// Create, list, show, export and delete keys
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Sign a file (or a digest) with a key
    Sign(sign::SignArgs),
    /// Check a signature made with a key
    Verify(sign::VerifyArgs),
    /// ML-KEM: encapsulate to an ML-KEM key, decapsulate with it in the vault
    #[command(subcommand)]
    Kem(kem::KemCommand),
    /// Print a certificate signing request (PKCS#10, PEM) for a key, signed in the TPM
    Csr(cert::CsrArgs),
    /// Self-sign, import, show, and enroll or renew with an ACME CA, the certificate chain of a key
    #[command(subcommand)]
    Cert(cert::CertCommand),
    /// Create and delete data keys (TPM-sealed AES-256 keys for encrypt/decrypt)
    #[command(subcommand)]
    Datakey(crypto::DatakeyCommand),
    /// Encrypt standard input to standard output with a data key
    Encrypt(crypto::EncryptArgs),
    /// Decrypt standard input (made by `encrypt`) to standard output
    Decrypt(crypto::DecryptArgs),
    /// Write N random bytes to standard output
    Random(crypto::RandomArgs),
    /// Quote PCRs with the attestation key into tpm2-tools files
    Quote(attest::QuoteArgs),
    /// Check a quote (signature, nonce, PCR values) in-core
    VerifyQuote(attest::VerifyQuoteArgs),
    /// Read PCR values; predict the value of a PCR after extends
    #[command(subcommand)]
    Pcr(attest::PcrCommand),
    /// Show and replay the measured-boot event log (from the daemon, or a file)
    #[command(subcommand)]
    Eventlog(eventlog::EventlogCommand),
    /// Show the attestation key; activate credentials made for it; certify the SRK
    #[command(subcommand)]
    Attest(attest::AttestCommand),
    /// Seal a secret (from stdin) to PCR values, by default sha256:9
    Seal(seal::SealArgs),
    /// Write a sealed secret to stdout
    Unseal(seal::UnsealArgs),
    /// Seal a secret for another device's TPM, offline (import it there with seal import)
    SealFor(seal_for::SealForArgs),
    /// Show the storage root key (what seal-for seals to)
    #[command(subcommand)]
    Srk(seal_for::SrkCommand),
    /// Check an SRK certification (attest srk) offline against the device's AK; write the SRK
    VerifySrk(seal_for::VerifySrkArgs),
    /// Sign PCR policies for secrets sealed with --authorized-by
    #[command(subcommand)]
    Policy(seal::PolicyCommand),
    /// Check access-policy decisions
    #[command(subcommand)]
    Access(access::AccessCommand),
    /// Serve the vault's keys over the OpenSSH agent protocol (keys stay in the vault)
    SshAgent(ssh_agent::SshAgentArgs),
    /// Be this device's Keylime agent (push model): register with a registrar, attest to a verifier
    KeylimeAgent(keylime::KeylimeAgentArgs),
    /// Print a shell completion script
    Completions(completions::CompletionsArgs),
}

/// Runs a parsed command line: prints results on stdout and any error as one line on stderr
/// (`tpm-vault: <message>`), and returns the exit status listed in `--help`.
///
/// Call it inside a tokio runtime (a current-thread one is enough).
pub async fn run(cli: Cli) -> ExitCode {
    let mut ctx = Context { socket: cli.global.socket, output: cli.global.output, client: None };
    match cli.command.run(&mut ctx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

impl Command {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            Command::Status(args) => args.run(ctx).await,
            Command::Key(command) => command.run(ctx).await,
            Command::Sign(args) => args.run(ctx).await,
            Command::Verify(args) => args.run(ctx).await,
            Command::Kem(command) => command.run(ctx).await,
            Command::Csr(args) => args.run(ctx).await,
            Command::Cert(command) => command.run(ctx).await,
            Command::Datakey(command) => command.run(ctx).await,
            Command::Encrypt(args) => args.run(ctx).await,
            Command::Decrypt(args) => args.run(ctx).await,
            Command::Random(args) => args.run(ctx).await,
            Command::Quote(args) => args.run(ctx).await,
            Command::VerifyQuote(args) => args.run(ctx).await,
            Command::Pcr(command) => command.run(ctx).await,
            Command::Eventlog(command) => command.run(ctx).await,
            Command::Attest(command) => command.run(ctx).await,
            Command::Seal(args) => args.run(ctx).await,
            Command::Unseal(args) => args.run(ctx).await,
            Command::SealFor(args) => args.run(),
            Command::Srk(command) => command.run(ctx).await,
            Command::VerifySrk(args) => args.run(ctx),
            Command::Policy(command) => command.run(ctx).await,
            Command::Access(command) => command.run(ctx).await,
            Command::SshAgent(args) => args.run(ctx).await,
            Command::KeylimeAgent(args) => args.run(ctx).await,
            Command::Completions(args) => args.run(ctx),
        }
    }
}

/// What commands share: the global options and the connection.
#[derive(Debug)]
struct Context {
    /// The daemon's socket, from `--socket`.
    socket: PathBuf,
    /// From `--output`.
    output: OutputFormat,
    /// Connected on first use, so that commands needing no daemon (completions) work without it.
    client: Option<Client>,
}

/// Resolves when the process gets SIGTERM or SIGINT: how the long-running commands (`ssh-agent`,
/// `keylime-agent`) learn to stop cleanly. Never resolves if the handlers cannot be installed.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

impl Context {
    /// The client, connecting on first use.
    async fn client(&mut self) -> Result<Client, CliError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = Client::connect(&self.socket).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Prints a command's result on stdout in the chosen format.
    fn emit(&self, report: &dyn Report) -> Result<(), CliError> {
        let mut buf = Vec::new();
        output::render(self.output, report, &mut buf).map_err(CliError::stdout)?;
        files::write_stdout(&buf)
    }
}

#[cfg(test)]
mod tests;
