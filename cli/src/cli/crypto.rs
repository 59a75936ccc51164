//! `tpm-vault datakey ...`, `encrypt`, `decrypt` and `random`: bulk cryptography.
//!
//! `encrypt` and `decrypt` stream standard input to standard output in bounded memory: the
//! daemon makes (or unwraps) the stream's own key with the data key, which never leaves it, and
//! this process does the AES-256-GCM work on all its cores (`--in-daemon`: the daemon does it).
//! A progress line goes to stderr for long streams when it is a terminal. For `decrypt NAME`,
//! NAME is compared with the key named in the stream header.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tpm_vault_client::parse_pcr_selection as parse_selection;
use tpm_vault_client::read_stream_header as read_header;
use tpm_vault_client::SyncIo;
use tpm_vault_client::{Client, DataKey, Error, PcrBinding};

use super::error::CliError;
use super::output::{fields, Report};
use super::progress::{stdin_size, Progress};
use super::Context;

/// `tpm-vault datakey ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DatakeyCommand {
    /// Create a data key: 256 random bits sealed by the TPM, used by `encrypt` and `decrypt`
    Create(DatakeyCreateArgs),
    /// Delete a data key for good: what was encrypted with it can no longer be decrypted
    Delete(DatakeyDeleteArgs),
}

impl DatakeyCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            DatakeyCommand::Create(args) => args.run(ctx).await,
            DatakeyCommand::Delete(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault datakey create`.
#[derive(Debug, Args)]
pub(crate) struct DatakeyCreateArgs {
    /// Data key name: [a-z0-9][a-z0-9._-]{0,63}
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Make the key usable only while PCRs hold given values, e.g. sha256:9
    ///
    /// BANK:IDX[,IDX] binds to the values at creation; BANK:IDX=HEX[,IDX=HEX] to given
    /// (e.g. future) values.
    #[arg(long, value_name = "BANK:IDX[,IDX]", value_parser = parse_pcr)]
    pub(crate) pcr: Option<PcrBinding>,
}

impl DatakeyCreateArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let key = ctx.client().await?.create_data_key(&self.name, self.pcr).await?;
        ctx.emit(&DataKeyReport(key))
    }
}

/// `tpm-vault datakey delete`.
#[derive(Debug, Args)]
pub(crate) struct DatakeyDeleteArgs {
    /// Data key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
}

impl DatakeyDeleteArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        ctx.client().await?.delete_data_key(&self.name).await?;
        ctx.emit(&DataKeyDeletedReport { name: self.name })
    }
}

/// `tpm-vault encrypt`.
#[derive(Debug, Args)]
#[command(after_help = "Example: tpm-vault encrypt backups --context host-1 < backup.tar > backup.tar.sealed\n\n\
The daemon makes a key for this stream alone and wraps it with the data key, which never leaves \
it; this process encrypts with it on all cores (--in-daemon: the daemon does). The output is \
authenticated in 64 KiB chunks: decryption detects any change, truncation or reordering, and a \
wrong key or context.")]
pub(crate) struct EncryptArgs {
    /// The data key to encrypt with
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Bound into the encrypted data: decryption needs the same string
    #[arg(long, value_name = "STR", default_value = "")]
    pub(crate) context: String,
    /// Let the daemon do the AES work (the Encrypt RPC) instead of this process
    #[arg(long)]
    pub(crate) in_daemon: bool,
}

/// Standard input and output as plain blocking files (duplicates of fds 0 and 1), for the bulk
/// data: read straight into the stream's chunk buffers and written straight from them
/// ([`SyncIo`]). The daemon is called once per stream, before the data flows.
fn stdio() -> Result<(SyncIo<File>, SyncIo<File>), CliError> {
    let input = io::stdin().as_fd().try_clone_to_owned().map_err(CliError::read(Path::new("-")))?;
    let output = io::stdout().as_fd().try_clone_to_owned().map_err(CliError::stdout)?;
    Ok((SyncIo(File::from(input)), SyncIo(File::from(output))))
}

/// `client` for a stream written to `output`: unless that is a character device (`/dev/null`),
/// where a `write` costs nothing, writing the stream costs this thread as much as a plain copy
/// and it keeps a CPU to itself (see `bulk::Threads`).
fn for_output(client: Client, output: &File) -> Client {
    match output.metadata() {
        Ok(m) if m.file_type().is_char_device() => client,
        _ => client.with_bulk_io_core(),
    }
}

impl EncryptArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        if io::stdout().is_terminal() {
            return Err(Error::InvalidInput(
                "refusing to write encrypted data to a terminal: redirect standard output".to_owned(),
            )
            .into());
        }
        let (stdin, mut output) = stdio()?;
        let client = for_output(ctx.client().await?, &output.0);
        let mut input = Progress::new(stdin, "encrypting", stdin_size());
        let context = self.context.as_bytes();
        let done = if self.in_daemon {
            client.copy_encrypt_in_daemon(&self.name, context, &mut input, &mut output).await
        } else {
            client.copy_encrypt(&self.name, context, &mut input, &mut output).await
        };
        done.map_err(stream_error)?;
        output.flush().await.map_err(CliError::stdout)?;
        Ok(())
    }
}

/// `tpm-vault decrypt`.
#[derive(Debug, Args)]
#[command(after_help = "Example: tpm-vault decrypt --context host-1 < backup.tar.sealed > backup.tar\n\n\
Only authenticated data is written. If the input was tampered with or truncated, the command \
fails (exit 2) naming the chunk; what it wrote before that chunk is authentic but incomplete.")]
pub(crate) struct DecryptArgs {
    /// The data key the input must have been encrypted with (the input names its key)
    #[arg(value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// The string given to `encrypt --context`
    #[arg(long, value_name = "STR", default_value = "")]
    pub(crate) context: String,
    /// Let the daemon do the AES work (the Decrypt RPC) instead of this process
    #[arg(long)]
    pub(crate) in_daemon: bool,
}

impl DecryptArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let (mut stdin, mut output) = stdio()?;
        let mut head = Vec::new();
        if let Some(expected) = &self.name {
            let (header, _) = read_header(&mut stdin, &mut head).await.map_err(stream_error)?;
            let found = header.key_name;
            if &found != expected {
                return Err(Error::InvalidInput(format!(
                    "the input was encrypted with data key {found:?}, not {expected:?}"
                ))
                .into());
            }
        }
        let client = for_output(ctx.client().await?, &output.0);
        let mut input = Progress::new(io::Cursor::new(head).chain(stdin), "decrypting", stdin_size());
        let context = self.context.as_bytes();
        let done = if self.in_daemon {
            client.copy_decrypt_in_daemon(context, &mut input, &mut output).await
        } else {
            client.copy_decrypt(context, &mut input, &mut output).await
        };
        // What was written so far is authentic: send it on before reporting a failure.
        let flushed = output.flush().await.map_err(CliError::stdout);
        done.map_err(stream_error)?;
        flushed?;
        Ok(())
    }
}

/// `tpm-vault random`.
#[derive(Debug, Args)]
#[command(after_help = "Example: tpm-vault random 32 > key.bin\n\n\
The bytes come from the daemon's DRBG, seeded from the OS and the TPM; at most 1 MiB per request \
(the daemon's bound), so a larger N is asked for in several. The output is raw bytes, also with --output json.")]
pub(crate) struct RandomArgs {
    /// How many bytes
    #[arg(value_name = "N")]
    pub(crate) len: u64,
}

impl RandomArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let client = ctx.client().await?;
        let mut output = Progress::new(tokio::io::stdout(), "random", Some(self.len));
        client.write_random(self.len, &mut output).await.map_err(stream_error)?;
        Ok(())
    }
}

/// A streaming call's error, with failures of stdin and stdout worded as such.
fn stream_error(error: Error) -> CliError {
    match error {
        Error::Read(source) => CliError::read(Path::new("-"))(source),
        Error::Write(source) => CliError::stdout(source),
        other => CliError::Client(other),
    }
}

/// Parses `--pcr`, leaving the "invalid value" context to clap.
fn parse_pcr(text: &str) -> Result<PcrBinding, String> {
    parse_selection(text).map_err(|e| e.to_string())
}

/// A data key, from `datakey create`.
pub(crate) struct DataKeyReport(pub(crate) DataKey);

impl Report for DataKeyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        fields(out, &[("name", self.0.name.clone()), ("key id", self.0.key_id.clone())])
    }

    fn json(&self) -> Value {
        json!({ "name": self.0.name, "key_id": self.0.key_id })
    }
}

/// A deleted data key, from `datakey delete`.
pub(crate) struct DataKeyDeletedReport {
    /// The key's name.
    pub(crate) name: String,
}

impl Report for DataKeyDeletedReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "Deleted data key {:?}", self.name)
    }

    fn json(&self) -> Value {
        json!({ "name": self.name, "deleted": true })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())).map(|cli| cli.command)
    }

    #[test]
    fn commands_parse() {
        let Ok(Command::Datakey(DatakeyCommand::Create(args))) =
            parse(&["datakey", "create", "dk", "--pcr", "sha256:9"])
        else {
            panic!("datakey create");
        };
        assert_eq!((args.name.as_str(), args.pcr.map(|p| p.to_string())), ("dk", Some("sha256:9".to_owned())));
        let Ok(Command::Encrypt(args)) = parse(&["encrypt", "dk", "--context", "t1"]) else { panic!("encrypt") };
        assert_eq!((args.name.as_str(), args.context.as_str()), ("dk", "t1"));
        let Ok(Command::Decrypt(args)) = parse(&["decrypt"]) else { panic!("decrypt") };
        assert_eq!((args.name, args.context.as_str()), (None, ""));
        let Ok(Command::Decrypt(args)) = parse(&["decrypt", "dk"]) else { panic!("decrypt NAME") };
        assert_eq!(args.name.as_deref(), Some("dk"));
        let Ok(Command::Random(args)) = parse(&["random", "1048576"]) else { panic!("random") };
        assert_eq!(args.len, 1 << 20);
        assert!(parse(&["encrypt"]).is_err(), "NAME is required");
        assert!(parse(&["random", "lots"]).is_err());
        assert!(parse(&["datakey", "create", "dk", "--pcr", "sha256:99"]).is_err());
    }

    /// A v1 header (key id 0, 64 KiB chunks, nonce prefix 0).
    fn header(name: &str) -> Vec<u8> {
        let mut h = b"TPMVAEAD".to_vec();
        h.push(1);
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(&[0u8; 16]);
        h.extend_from_slice(&65536u32.to_be_bytes());
        h.extend_from_slice(&[0u8; 7]);
        h
    }

    #[tokio::test]
    async fn header_is_read_and_kept() {
        let mut stream = header("backups");
        stream.extend_from_slice(&[9u8; 1000]);
        let mut input = &stream[..];
        let mut head = Vec::new();
        assert_eq!(read_header(&mut input, &mut head).await.unwrap().0.key_name, "backups");
        // Nothing is lost: what was read is in `head`, the rest still in the input.
        let mut rest = head.clone();
        rest.extend_from_slice(input);
        assert_eq!(rest, stream);
    }

    #[tokio::test]
    async fn short_or_foreign_input() {
        let h = header("k");
        let mut input = &h[..h.len() - 1];
        let err = stream_error(read_header(&mut input, &mut Vec::new()).await.unwrap_err());
        assert!(err.to_string().starts_with("stream truncated"), "{err}");
        let mut input = &b"plain text, not encrypted"[..];
        let err = stream_error(read_header(&mut input, &mut Vec::new()).await.unwrap_err());
        assert_eq!(err.to_string(), "not a tpm-vault encrypted stream: bad magic");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn io_failures_name_stdin_and_stdout() {
        let err = stream_error(Error::Read(io::Error::from_raw_os_error(5)));
        assert_eq!(err.to_string(), "cannot read standard input: Input/output error");
        let err = stream_error(Error::Write(io::Error::from_raw_os_error(28)));
        assert_eq!(err.to_string(), "cannot write standard output: No space left on device");
    }
}
