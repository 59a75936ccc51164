//! `tpm-vault cert enroll` and `tpm-vault cert renew`: certificates from an ACME CA for vault
//! keys (the protocol is in [`crate::acme`]).
//!
//! Owns the options, the access check (both need `admin` on the key, asked of the daemon with
//! `CheckAccess`), the state file (read whole, written atomically and owner-only) and the
//! `--new-key` naming: an enrollment named NAME first holds its certificate in key NAME; each
//! rotation creates `NAME.2`, `NAME.3`, ... (same algorithm), stores the new chain there and
//! only then records it as the enrollment's key. The previous key is kept, so programs still
//! configured with it keep working until they are pointed at the new one.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::prelude::{Engine as _, BASE64_URL_SAFE_NO_PAD};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::acme::state::{Enrollment, State};
use crate::acme::{self, AcmeError, Ca, Connect, EabKey, Method};
use tpm_vault_client::{Client, Error, KeyAlgorithm, Operation};

use super::error::CliError;
use super::files;
use super::output::{rfc3339, Report};
use super::Context;

/// Where the ACME state lives unless `--acme-state` or `TPM_VAULT_ACME_STATE` says otherwise
/// (the renewal unit's `StateDirectory`).
pub(crate) const DEFAULT_STATE: &str = "/var/lib/tpm-vault-acme/state.json";

/// Largest state file read.
const MAX_STATE: usize = 4 * 1024 * 1024;

/// Largest EAB key file read.
const MAX_EAB_FILE: usize = 4096;

/// The default account key name.
const DEFAULT_ACCOUNT_KEY: &str = "acme-account";

/// The state-file option both commands take.
#[derive(Debug, Args)]
pub(crate) struct StateArgs {
    /// ACME state file: account URLs and enrollments, for `cert renew`
    #[arg(long, value_name = "FILE", env = "TPM_VAULT_ACME_STATE", default_value = DEFAULT_STATE)]
    acme_state: PathBuf,
}

impl StateArgs {
    /// Takes the state's lock (`FILE.lock`, waiting for another enroll or renew to finish),
    /// held until the returned guard drops, so two runs never overwrite each other's records.
    fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, CliError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut name = self.acme_state.clone().into_os_string();
        name.push(".lock");
        let path = PathBuf::from(name);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(CliError::write(dir))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(CliError::write(&path))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| CliError::write(&path)(io::Error::from(errno)))
    }

    fn load(&self) -> Result<State, CliError> {
        let text = match files::read_limited(&self.acme_state, MAX_STATE, "an ACME state file") {
            Ok(text) => text,
            Err(CliError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        State::parse(&String::from_utf8_lossy(&text)).map_err(|reason| {
            Error::InvalidInput(format!("ACME state file {}: {reason}", self.acme_state.display())).into()
        })
    }

    fn save(&self, state: &State) -> Result<(), CliError> {
        if let Some(dir) = self.acme_state.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(CliError::write(dir))?;
        }
        files::write_secret(&self.acme_state, state.to_json().as_bytes())
    }
}

/// `--challenge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ChallengeKind {
    /// Serve /.well-known/acme-challenge/ over HTTP on --http-listen
    #[value(name = "http-01")]
    Http01,
    /// Answer TLS with ALPN acme-tls/1 on --tls-listen
    #[value(name = "tls-alpn-01")]
    TlsAlpn01,
    /// Publish a TXT record with --dns-hook
    #[value(name = "dns-01")]
    Dns01,
}

/// `tpm-vault cert enroll`.
#[derive(Debug, Args)]
pub(crate) struct EnrollArgs {
    /// Key name (created as ecc-p256 if it does not exist); also the enrollment's name
    #[arg(value_name = "NAME")]
    name: String,
    /// The CA's ACME directory URL
    #[arg(long, value_name = "DIRECTORY_URL")]
    acme: String,
    /// DNS name to certify (repeatable; the first is also the subject's CN)
    #[arg(long = "domain", value_name = "D")]
    domains: Vec<String>,
    /// IP address to certify (repeatable)
    #[arg(long = "ip", value_name = "A")]
    ips: Vec<IpAddr>,
    /// PEM bundle to trust for the CA's HTTPS [default: the system's]
    #[arg(long, value_name = "PEM")]
    ca_bundle: Option<PathBuf>,
    /// External Account Binding key id (with --eab-hmac-file)
    #[arg(long, value_name = "ID", requires = "eab_hmac_file")]
    eab_kid: Option<String>,
    /// File holding the EAB HMAC key, base64url as CAs hand it out
    #[arg(long, value_name = "F", requires = "eab_kid")]
    eab_hmac_file: Option<PathBuf>,
    /// Account contact, e.g. mailto:ops@example.com (repeatable)
    #[arg(long, value_name = "mailto:...")]
    contact: Vec<String>,
    /// How to prove control of the names
    #[arg(long, value_enum, default_value_t = ChallengeKind::Http01)]
    challenge: ChallengeKind,
    /// http-01: where to serve the answers (the CA connects to port 80)
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:80")]
    http_listen: SocketAddr,
    /// tls-alpn-01: where to answer (the CA connects to port 443)
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:443")]
    tls_listen: SocketAddr,
    /// dns-01: command run as `CMD add|del _acme-challenge.NAME VALUE`
    #[arg(long, value_name = "CMD", required_if_eq("challenge", "dns-01"))]
    dns_hook: Option<String>,
    /// Vault key of the ACME account (ecc-p256, created on first use)
    #[arg(long, value_name = "NAME", default_value = DEFAULT_ACCOUNT_KEY)]
    account_key: String,
    /// State file
    #[command(flatten)]
    state: StateArgs,
}

impl EnrollArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let method = match self.challenge {
            ChallengeKind::Http01 => Method::Http01 { listen: self.http_listen },
            ChallengeKind::TlsAlpn01 => Method::TlsAlpn01 { listen: self.tls_listen },
            ChallengeKind::Dns01 => Method::Dns01 { hook: self.dns_hook.clone().unwrap_or_default() },
        };
        if self.domains.is_empty() && self.ips.is_empty() {
            return Err(Error::InvalidInput("give at least one --domain or --ip".into()).into());
        }
        if self.account_key == self.name {
            return Err(Error::InvalidInput(format!(
                "the ACME account key must not be the key being certified ({}); pick another --account-key",
                self.name
            ))
            .into());
        }
        let eab = match (&self.eab_kid, &self.eab_hmac_file) {
            (Some(kid), Some(file)) => Some(read_eab(kid, file)?),
            _ => None,
        };
        let _lock = self.state.lock()?;
        let mut state = self.state.load()?;
        let client = ctx.client().await?;
        require_admin(&client, &self.name).await?;
        match client.key(&self.name).await {
            Ok(_) => {}
            Err(e) if e.code() == tonic::Code::NotFound => {
                client.create_key(&self.name, KeyAlgorithm::EccP256, None).await?;
            }
            Err(e) => return Err(e.into()),
        }
        let enrollment = Enrollment {
            key: self.name.clone(),
            generation: 1,
            directory: self.acme.clone(),
            account_key: self.account_key.clone(),
            domains: self.domains.clone(),
            ips: self.ips.clone(),
            challenge: method,
            ca_bundle: self.ca_bundle.clone(),
            contact: self.contact.clone(),
        };
        let ca = open_account(&client, &mut state, &enrollment, eab, &self.state).await?;
        let chain = ca
            .issue(&client, &enrollment.key, &enrollment.domains, &enrollment.ips, &enrollment.challenge, None)
            .await?;
        let stored = client.set_certificate(&enrollment.key, &chain).await?;
        state.enrollments.insert(self.name.clone(), enrollment);
        self.state.save(&state)?;
        ctx.emit(&Outcome::issued(&self.name, &stored.name, stored.version, &chain, "enrolled"))
    }
}

/// `tpm-vault cert renew`.
#[derive(Debug, Args)]
pub(crate) struct RenewArgs {
    /// The enrollment to renew (the NAME given to `cert enroll`)
    #[arg(value_name = "NAME", required_unless_present = "all", conflicts_with = "all")]
    name: Option<String>,
    /// Renew every enrollment that is due
    #[arg(long)]
    all: bool,
    /// Renew when the certificate expires within DAYS [default: the CA's ARI window, else a
    /// third of its lifetime]
    #[arg(long, value_name = "DAYS")]
    before: Option<u32>,
    /// Move to a new vault key NAME.N (same algorithm); the old key is kept
    #[arg(long)]
    new_key: bool,
    /// State file
    #[command(flatten)]
    state: StateArgs,
}

impl RenewArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let _lock = self.state.lock()?;
        let mut state = self.state.load()?;
        let names: Vec<String> = match &self.name {
            Some(name) if state.enrollments.contains_key(name) => vec![name.clone()],
            Some(name) => {
                return Err(Error::InvalidInput(format!(
                    "no ACME enrollment named {name} in {} (enroll it with `tpm-vault cert enroll`)",
                    self.state.acme_state.display()
                ))
                .into())
            }
            None => state.enrollments.keys().cloned().collect(),
        };
        let client = ctx.client().await?;
        let mut outcomes = Vec::new();
        let mut first_error = None;
        for name in names {
            match self.renew_one(&client, &mut state, &name).await {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    outcomes.push(Outcome::failed(&name, &e));
                    first_error.get_or_insert(e);
                }
            }
        }
        ctx.emit(&Outcomes(outcomes))?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn renew_one(&self, client: &Client, state: &mut State, name: &str) -> Result<Outcome, CliError> {
        let Some(enrollment) = state.enrollments.get(name).cloned() else {
            return Err(Error::InvalidInput(format!("no ACME enrollment named {name}")).into());
        };
        require_admin(client, &enrollment.key).await?;
        let current = client.certificate(&enrollment.key).await?;
        let (not_before, not_after) = acme::validity(&current.chain_pem).ok_or_else(|| {
            CliError::from(AcmeError::Local(format!("the certificate of key {} does not parse", enrollment.key)))
        })?;
        let before = self.before.map(|d| Duration::from_secs(u64::from(d) * 86400));
        let now = SystemTime::now();
        // Decided without the CA where it has no say: --before, or a CA that cannot be reached
        // while the certificate is not due by its lifetime (that is no failure).
        let local = acme::renewal_due(not_before, not_after, now, before, None);
        if before.is_some() && !local.now {
            return Ok(Outcome::not_due(name, &enrollment.key, not_after, &local));
        }
        let ca = match open_account(client, state, &enrollment, None, &self.state).await {
            Ok(ca) => ca,
            Err(e) if !local.now => {
                let mut outcome = Outcome::not_due(name, &enrollment.key, not_after, &local);
                outcome.detail = Some(format!(
                    "{}; the CA was not reached for its renewal window: {e}",
                    outcome.detail.unwrap_or_default()
                ));
                return Ok(outcome);
            }
            Err(e) => return Err(e),
        };
        let window = if before.is_none() { ca.renewal_window(&current.chain_pem).await } else { None };
        let due = acme::renewal_due(not_before, not_after, now, before, window.as_ref().map(|w| w.0));
        if !due.now {
            return Ok(Outcome::not_due(name, &enrollment.key, not_after, &due));
        }
        let replaces = window.map(|w| w.2);
        if !self.new_key {
            let chain = ca
                .issue(client, &enrollment.key, &enrollment.domains, &enrollment.ips, &enrollment.challenge, replaces)
                .await?;
            let stored = client.set_certificate(&enrollment.key, &chain).await?;
            return Ok(Outcome::issued(name, &stored.name, stored.version, &chain, "renewed"));
        }
        let generation = enrollment.generation + 1;
        let new_key = format!("{name}.{generation}");
        let algorithm = client.key(&enrollment.key).await?.algorithm;
        client.create_key(&new_key, algorithm, None).await?;
        let issued = async {
            let chain = ca
                .issue(client, &new_key, &enrollment.domains, &enrollment.ips, &enrollment.challenge, replaces)
                .await?;
            let stored = client.set_certificate(&new_key, &chain).await?;
            Ok::<_, CliError>((chain, stored))
        }
        .await;
        let (chain, stored) = match issued {
            Ok(done) => done,
            Err(e) => {
                // The old key still holds the valid chain; the unused new key goes.
                let _ = client.delete_key(&new_key).await;
                return Err(e);
            }
        };
        let mut updated = enrollment.clone();
        updated.key = new_key.clone();
        updated.generation = generation;
        state.enrollments.insert(name.to_owned(), updated);
        self.state.save(state)?;
        let mut outcome = Outcome::issued(name, &stored.name, stored.version, &chain, "renewed with a new key");
        outcome.previous_key = Some(enrollment.key);
        Ok(outcome)
    }
}

/// Refuses unless the caller has `admin` on `key` (asked of the daemon for the caller's uid).
async fn require_admin(client: &Client, key: &str) -> Result<(), CliError> {
    let uid = nix::unistd::getuid().as_raw();
    let denied = || {
        CliError::Client(Error::Status(tonic::Status::permission_denied(format!(
            "ACME enrollment and renewal of key {key} need the `admin` operation on it (uid {uid})"
        ))))
    };
    match client.check_access(uid, Operation::Admin, Some(key)).await {
        Ok(check) if check.is_allowed() => Ok(()),
        Ok(_) => Err(denied()),
        Err(e) if e.code() == tonic::Code::PermissionDenied => Err(denied()),
        Err(e) => Err(e.into()),
    }
}

/// Opens (or registers) the enrollment's account and remembers its URL.
async fn open_account(
    client: &Client,
    state: &mut State,
    enrollment: &Enrollment,
    eab: Option<EabKey>,
    file: &StateArgs,
) -> Result<Ca, CliError> {
    let known = state.account(&enrollment.directory, &enrollment.account_key).map(str::to_owned);
    let ca = Ca::connect(
        client,
        Connect {
            directory: &enrollment.directory,
            ca_bundle: enrollment.ca_bundle.as_deref(),
            account_key: &enrollment.account_key,
            account_url: known.as_deref(),
            contact: &enrollment.contact,
            eab,
        },
    )
    .await?;
    if known.as_deref() != Some(ca.account_url()) {
        state.set_account(&enrollment.directory, ca.account_key(), ca.account_url());
        file.save(state)?;
    }
    Ok(ca)
}

/// Reads an EAB key file (base64url, padding and whitespace tolerated).
fn read_eab(kid: &str, file: &Path) -> Result<EabKey, CliError> {
    let text = Zeroizing::new(files::read_limited(file, MAX_EAB_FILE, "an EAB HMAC key")?);
    let trimmed: Vec<u8> = text.iter().copied().filter(|b| !b.is_ascii_whitespace() && *b != b'=').collect();
    let trimmed = Zeroizing::new(trimmed);
    let hmac = BASE64_URL_SAFE_NO_PAD
        .decode(trimmed.as_slice())
        .map_err(|_| Error::InvalidInput(format!("{} does not hold a base64url HMAC key", file.display())))?;
    Ok(EabKey { kid: kid.to_owned(), hmac: Zeroizing::new(hmac) })
}

/// What happened to one enrollment.
#[derive(Debug)]
struct Outcome {
    name: String,
    key: String,
    result: &'static str,
    not_after: Option<SystemTime>,
    version: Option<u64>,
    previous_key: Option<String>,
    detail: Option<String>,
}

impl Outcome {
    fn issued(name: &str, key: &str, version: u64, chain: &str, result: &'static str) -> Outcome {
        Outcome {
            name: name.into(),
            key: key.into(),
            result,
            not_after: acme::validity(chain).map(|v| v.1),
            version: Some(version),
            previous_key: None,
            detail: None,
        }
    }

    fn not_due(name: &str, key: &str, not_after: SystemTime, due: &acme::Due) -> Outcome {
        Outcome {
            name: name.into(),
            key: key.into(),
            result: "not due",
            not_after: Some(not_after),
            version: None,
            previous_key: None,
            detail: Some(format!("due from {} ({})", unix(due.from).map(rfc3339).unwrap_or_default(), due.rule)),
        }
    }

    fn failed(name: &str, e: &CliError) -> Outcome {
        Outcome {
            name: name.into(),
            key: String::new(),
            result: "failed",
            not_after: None,
            version: None,
            previous_key: None,
            detail: Some(e.to_string()),
        }
    }

    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "key": self.key,
            "result": self.result,
            "not_after": self.not_after.and_then(unix).map(rfc3339),
            "version": self.version,
            "previous_key": self.previous_key,
            "detail": self.detail,
        })
    }

    fn line(&self) -> String {
        let mut line = format!("{}: {}", self.name, self.result);
        if !self.key.is_empty() {
            line.push_str(&format!(", key {}", self.key));
        }
        if let Some(v) = self.version {
            line.push_str(&format!(", chain version {v}"));
        }
        if let Some(t) = self.not_after.and_then(unix) {
            line.push_str(&format!(", expires {}", rfc3339(t)));
        }
        if let Some(previous) = &self.previous_key {
            line.push_str(&format!(" (previous key {previous} kept; delete it once nothing uses it)"));
        }
        if let Some(detail) = &self.detail {
            line.push_str(&format!("; {detail}"));
        }
        line
    }
}

impl Report for Outcome {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.line())
    }

    fn json(&self) -> Value {
        Outcome::json(self)
    }
}

/// `renew`'s outcomes, one per enrollment.
struct Outcomes(Vec<Outcome>);

impl Report for Outcomes {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.0.is_empty() {
            writeln!(out, "no ACME enrollments")?;
        }
        self.0.iter().try_for_each(|o| writeln!(out, "{}", o.line()))
    }

    fn json(&self) -> Value {
        json!({ "certificates": self.0.iter().map(Outcome::json).collect::<Vec<_>>() })
    }
}

fn unix(t: SystemTime) -> Option<i64> {
    t.duration_since(SystemTime::UNIX_EPOCH).ok().and_then(|d| i64::try_from(d.as_secs()).ok())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::cert::CertCommand;
    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        let mut argv = vec!["tpm-vault"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| cli.command)
    }

    #[test]
    fn enroll_and_renew_options() {
        let Ok(Command::Cert(CertCommand::Enroll(args))) =
            parse(&["cert", "enroll", "web", "--acme", "https://ca/dir", "--domain", "a.test", "--ip", "10.0.0.1"])
        else {
            panic!("not enroll")
        };
        assert_eq!(args.challenge, ChallengeKind::Http01);
        assert_eq!(args.http_listen, "0.0.0.0:80".parse::<SocketAddr>().unwrap());
        assert_eq!(args.account_key, "acme-account");
        // dns-01 needs its hook; EAB needs both halves; renew needs a name or --all, not both.
        assert!(parse(&["cert", "enroll", "web", "--acme", "u", "--domain", "a", "--challenge", "dns-01"]).is_err());
        assert!(parse(&["cert", "enroll", "web", "--acme", "u", "--domain", "a", "--eab-kid", "k"]).is_err());
        assert!(parse(&["cert", "renew"]).is_err());
        assert!(parse(&["cert", "renew", "web", "--all"]).is_err());
        let Ok(Command::Cert(CertCommand::Renew(args))) =
            parse(&["cert", "renew", "--all", "--before", "30", "--new-key"])
        else {
            panic!("not renew")
        };
        assert!(args.all && args.new_key && args.before == Some(30));
    }

    #[test]
    fn eab_keys_are_base64url_with_or_without_padding() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eab");
        std::fs::write(&file, "AQID-_8=\n").unwrap();
        assert_eq!(read_eab("kid", &file).unwrap().hmac.as_slice(), [1, 2, 3, 0xfb, 0xff]);
        std::fs::write(&file, "not base64 !").unwrap();
        assert!(read_eab("kid", &file).is_err());
    }
}
