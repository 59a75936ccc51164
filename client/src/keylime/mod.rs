//! A Keylime agent for the push model (REST API v3.0, Keylime 7.14): the vault's device is
//! attested by a stock Keylime registrar and verifier, with the TPM used only through the
//! daemon (`tpm-vault keylime-agent`).
//!
//! Owns the protocol: registration with the registrar (EK certificate and public area, the AK's
//! TPM2B_PUBLIC, the MakeCredential challenge recovered with ActivateCredential, the HMAC
//! `auth_tag`), the verifier's session (proof of possession: TPM2_Certify of the AK by itself
//! over the verifier's nonce, for a bearer token), and each attestation round (capabilities,
//! then a quote over the PCRs and nonce the verifier chose, with the UEFI event log when the
//! device has one; the next round when the verifier says; `Retry-After` on 429/503; a new
//! session on 401). It does not own the TPM (the daemon does, and its access policy and audit
//! log apply: the `quote` operation covers every call made here), the command line
//! (`crate::cli`) or the HTTP transport (`http`). It moves with the CLI into the application
//! crate when the library is split from it (issue #33).
//!
//! The AK is the vault's RSA 2048 attestation key (RSASSA-SHA256, created on first use):
//! Keylime 7.14.3's proof-of-possession check asks for `rsassa` whatever the key
//! (`keylime/models/verifier/auth_session.py`, `create_in_memory`), and its tenant accepts
//! `ecschnorr` and `rsassa` by default, so the vault's ECC AK would be refused by a stock
//! deployment.

mod http;
mod protocol;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ::http::{Method, StatusCode};
use base64::Engine as _;
use serde_json::Value;

use crate::attest::{AkAlg, CredentialFile};
use crate::{Client, PcrBinding};
use http::{JsonClient, JsonResponse};

pub use protocol::EvidenceRequest;

/// The PCRs offered when none are configured: what a device without IMA (the Jetson Orin,
/// whose fTPM appears after `tee-supplicant`, too late for IMA) can vouch for with its UEFI
/// event log: 0-9 (firmware, boot loader, kernel), plus 11-15, which Keylime 7.14.3 requires
/// in the quote as soon as the agent has a measured-boot policy (`MEASUREDBOOT_PCRS` in
/// `keylime/config.py`; offering 0-9 only, the capabilities are refused with 422). Never IMA's
/// PCR 10.
pub const DEFAULT_PCRS: [u32; 15] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15];

/// Next round when the verifier does not say.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// The agent's settings (the command line and the config file fill them).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The agent's UUID (what the tenant enrolls).
    pub uuid: String,
    /// The registrar's base URL (`http://host:8890` or `https://host:8891`).
    pub registrar: String,
    /// The verifier's base URL (`https://host:8881`).
    pub verifier: String,
    /// CA certificates (PEM) for the verifier's TLS certificate (default: the system bundle).
    pub verifier_ca: Option<PathBuf>,
    /// CA certificates (PEM) for the registrar's TLS certificate, for an `https` registrar.
    pub registrar_ca: Option<PathBuf>,
    /// The least time between rounds: the verifier's `seconds_to_next_attestation` wins when
    /// it is longer; used alone when the verifier says nothing.
    pub interval: Option<Duration>,
    /// The sha256 PCRs offered to the verifier.
    pub pcrs: Vec<u32>,
    /// Where the agent records its state (`status.json`), if anywhere.
    pub state_dir: Option<PathBuf>,
}

/// What went wrong, in words that say which side and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeylimeError {
    /// A setting is wrong (URL, CA file, UUID).
    #[error("{0}")]
    Config(String),
    /// The server could not be reached, or the connection dropped.
    #[error("{request}: {reason}")]
    Unreachable {
        /// The request.
        request: String,
        /// Why.
        reason: String,
    },
    /// The daemon refused or failed a call.
    #[error("tpm-vaultd: {0}")]
    Vault(#[from] crate::Error),
    /// The server answered with an error status.
    #[error("{request}: {status}{}", detail_suffix(.detail))]
    Refused {
        /// The request.
        request: String,
        /// The status.
        status: StatusCode,
        /// The server's explanation, if it gave one.
        detail: String,
        /// `Retry-After` seconds, on 429 and 503.
        retry_after: Option<u64>,
    },
    /// The server's answer is not what the API describes.
    #[error("{request}: unexpected answer: {reason}")]
    Protocol {
        /// The request.
        request: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// The verifier did not accept the proof of possession (the agent is not enrolled, or the
    /// AK is not the one the registrar holds for this UUID).
    #[error("the verifier refused the proof of possession for agent {uuid}: {detail}")]
    SessionRefused {
        /// The agent.
        uuid: String,
        /// The verifier's words.
        detail: String,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

impl KeylimeError {
    /// The wait the server asked for (429, 503).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { retry_after: Some(s), .. } => Some(Duration::from_secs(*s)),
            _ => None,
        }
    }

    /// The HTTP status, when the server answered with an error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// One attestation round's outcome as the verifier acknowledged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// The verifier's attestation index.
    pub index: String,
    /// The wait the verifier asks for before the next round.
    pub seconds_to_next: Option<u64>,
    /// The PCRs quoted.
    pub pcrs: Vec<u32>,
    /// Whether the UEFI event log was sent.
    pub sent_event_log: bool,
}

/// The evidence collected for one attestation ([`Agent::collect`]), ready to send
/// ([`Agent::submit`]).
#[derive(Debug, Clone)]
pub struct Evidence {
    /// The attestation it answers.
    pub index: String,
    /// The `PATCH` body (the quote and the event log: public material).
    body: Value,
    /// The PCRs quoted.
    pub pcrs: Vec<u32>,
    /// Whether the UEFI event log is included.
    pub sent_event_log: bool,
}

/// The agent: the daemon's client, the two servers and the verifier's session token.
pub struct Agent {
    client: Client,
    config: AgentConfig,
    registrar: JsonClient,
    verifier: JsonClient,
    /// The bearer token of the verifier's session, once proof of possession passed.
    token: Option<zeroize::Zeroizing<String>>,
    /// The AK and EK as registered: read once (reading the EK re-derives it in the TPM, an
    /// RSA key generation on a firmware TPM), not every round.
    keys: Option<crate::attest::AttestationKey>,
    /// The event log read for the capabilities of the round in progress, for its evidence.
    log: Option<Vec<u8>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("uuid", &self.config.uuid)
            .field("registrar", &self.registrar)
            .field("verifier", &self.verifier)
            .field("has_token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a verifier refuses a proof of possession (Keylime 7.14.3 answers 401 with no body, or
/// `evaluation: fail`).
const SESSION_REFUSED: &str = "the agent is not enrolled with this verifier, the AK is not the one registered for \
                               this UUID (another TPM?), or the challenge expired";

/// The API prefix of the verifier's push endpoints.
const API: &str = "/v3.0";

/// The API prefix of the registrar's registration endpoints (see [`Agent::register`]).
const REGISTRAR_API: &str = "/v2.6";

impl Agent {
    /// An agent for `config`, using `client` for every TPM operation.
    ///
    /// # Errors
    /// [`KeylimeError::Config`] for a malformed UUID, URL or CA file.
    pub fn new(client: Client, config: AgentConfig) -> Result<Self, KeylimeError> {
        protocol::check_uuid(&config.uuid)?;
        if config.pcrs.is_empty() || config.pcrs.iter().any(|&p| p > 23) {
            return Err(KeylimeError::Config("PCRs must be 0 to 23, at least one".into()));
        }
        let registrar =
            JsonClient::new("registrar", &config.registrar, config.registrar_ca.as_deref(), "application/json")?;
        let verifier =
            JsonClient::new("verifier", &config.verifier, config.verifier_ca.as_deref(), "application/vnd.api+json")?;
        if !config.verifier.starts_with("https://") {
            return Err(KeylimeError::Config(format!(
                "verifier URL {:?}: the verifier's push endpoints are served over https only",
                config.verifier
            )));
        }
        Ok(Self { client, config, registrar, verifier, token: None, keys: None, log: None })
    }

    /// Registers the EK and the AK with the registrar and activates the AK: the registrar's
    /// MakeCredential blob is opened with TPM2_ActivateCredential (which only the TPM holding
    /// both keys can do) and the HMAC of the UUID under the recovered secret is sent back.
    ///
    /// # Errors
    /// [`KeylimeError::Refused`] (403: this UUID is registered with another TPM's keys; 400:
    /// the registrar refused the keys), [`KeylimeError::Unreachable`], [`KeylimeError::Vault`].
    pub async fn register(&mut self) -> Result<(), KeylimeError> {
        let keys = self.client.attestation_key_of(AkAlg::Rsa2048).await?;
        let body = protocol::registration(&keys);
        self.keys = Some(keys);
        // The registrar's v3.0 POST /agents/ answers 500 in Keylime 7.14.3 (its controller calls
        // the v2 `respond()`, which refuses v3 requests): register through API 2.6, which the
        // same registrar serves.
        let path = format!("{REGISTRAR_API}/agents/{}", self.config.uuid);
        let r = self.registrar.send(Method::POST, &path, Some(&body), None).await?;
        let r = expect_ok(r, "POST", &path)?;
        let blob = r
            .body
            .pointer("/results/blob")
            .and_then(Value::as_str)
            .and_then(|b| b64().decode(b).ok())
            .ok_or_else(|| protocol_error("POST", &path, "no base64 results.blob"))?;
        let file =
            CredentialFile::parse(&blob).map_err(|e| protocol_error("POST", &path, &format!("the blob: {e}")))?;
        let secret =
            self.client.activate_credential_with(AkAlg::Rsa2048, &file.credential_blob, &file.encrypted_secret).await?;
        let tag = protocol::auth_tag(&secret, &self.config.uuid);
        let path = format!("{REGISTRAR_API}/agents/{}/activate", self.config.uuid);
        let body = serde_json::json!({ "auth_tag": tag });
        let r = self.registrar.send(Method::POST, &path, Some(&body), None).await?;
        expect_ok(r, "POST", &path)?;
        note(&format!("agent {} registered with the registrar and activated", self.config.uuid));
        Ok(())
    }

    /// Opens a session with the verifier: asks for a challenge, certifies the AK over it and
    /// keeps the bearer token the verifier gives for the proof.
    ///
    /// # Errors
    /// [`KeylimeError::SessionRefused`] when the verifier does not accept the proof (agent not
    /// enrolled, or not this AK); others as for any request.
    pub async fn open_session(&mut self) -> Result<(), KeylimeError> {
        self.token = None;
        let uuid = self.config.uuid.clone();
        let path = format!("{API}/sessions");
        let r = self.verifier.send(Method::POST, &path, Some(&protocol::session_request(&uuid)), None).await?;
        let r = expect_ok(r, "POST", &path)?;
        let (id, challenge) = protocol::session_challenge(&r.body).map_err(|e| protocol_error("POST", &path, &e))?;
        let proof = self.client.certify_attestation_key(AkAlg::Rsa2048, &challenge).await?;
        let path = format!("{API}/sessions/{id}");
        let body = protocol::session_proof(&uuid, &proof);
        let r = self.verifier.send(Method::PATCH, &path, Some(&body), None).await?;
        if r.status == StatusCode::UNAUTHORIZED {
            let mut detail = protocol::error_detail(&r.body);
            if detail.is_empty() {
                detail = SESSION_REFUSED.into();
            }
            return Err(KeylimeError::SessionRefused { uuid, detail });
        }
        let r = expect_ok(r, "PATCH", &path)?;
        let attrs = r.body.pointer("/data/attributes").cloned().unwrap_or(Value::Null);
        match (attrs.get("evaluation").and_then(Value::as_str), attrs.get("token").and_then(Value::as_str)) {
            (Some("pass"), Some(token)) => {
                self.token = Some(zeroize::Zeroizing::new(token.to_owned()));
                note(&format!("verifier session open for agent {uuid} (proof of possession accepted)"));
                Ok(())
            }
            _ => Err(KeylimeError::SessionRefused { uuid, detail: format!("evaluation fail ({SESSION_REFUSED})") }),
        }
    }

    /// One attestation round: capabilities, then the evidence the verifier asked for. Opens a
    /// session first if there is none, and once more if the verifier answers 401.
    ///
    /// # Errors
    /// [`KeylimeError::Refused`] with `retry_after` for 429/503; 403 when the verifier refuses
    /// the round (e.g. challenges expired); 404 when the agent is not enrolled; others as for
    /// any request.
    pub async fn attest_once(&mut self) -> Result<Round, KeylimeError> {
        if self.token.is_none() {
            self.open_session().await?;
        }
        match self.round().await {
            Err(e) if e.status() == Some(StatusCode::UNAUTHORIZED) => {
                note("the verifier's session ended (401): opening a new one");
                self.open_session().await?;
                self.round().await
            }
            other => other,
        }
    }

    async fn round(&mut self) -> Result<Round, KeylimeError> {
        let request = self.request_evidence().await?;
        let evidence = self.collect(&request).await?;
        self.submit(&evidence).await
    }

    /// A round's first step: sends the capabilities (the AK, the PCRs offered, the UEFI event
    /// log when the daemon has one) and returns what the verifier asks for, with its nonce.
    /// Needs a session ([`Agent::open_session`]; [`Agent::attest_once`] opens one itself).
    ///
    /// # Errors
    /// [`KeylimeError::Refused`]: 401 when the session ended, 429/503 with `retry_after`,
    /// 403 when the verifier refuses a new round now, 404 when the agent is not enrolled, 422
    /// when it cannot use what is offered (e.g. its policy needs PCRs that are not offered);
    /// others as for any request.
    pub async fn request_evidence(&mut self) -> Result<EvidenceRequest, KeylimeError> {
        let uuid = self.config.uuid.clone();
        let token = self.token.as_ref().map(|t| t.as_str().to_owned());
        let keys = match &self.keys {
            Some(k) => k.clone(),
            None => {
                let k = self.client.attestation_key_of(AkAlg::Rsa2048).await?;
                self.keys = Some(k.clone());
                k
            }
        };
        self.log = self.event_log().await?;
        let has_log = self.log.is_some();
        let caps = protocol::capabilities(&keys, &self.config.pcrs, has_log, boot_time());
        let path = format!("{API}/agents/{uuid}/attestations");
        let r = self.verifier.send(Method::POST, &path, Some(&caps), token.as_deref()).await?;
        let r = expect_ok(r, "POST", &path).map_err(|e| match e {
            // The verifier's policy needs what is not offered: say what was.
            KeylimeError::Refused { request, status: StatusCode::UNPROCESSABLE_ENTITY, detail, retry_after } => {
                let detail = format!("{detail} (offered: sha256 PCRs {}, RSA AK)", join(&self.config.pcrs));
                KeylimeError::Refused { request, status: StatusCode::UNPROCESSABLE_ENTITY, detail, retry_after }
            }
            e => e,
        })?;
        EvidenceRequest::parse(&r.body).map_err(|e| {
            let mut body = r.body.to_string();
            body.truncate(600);
            protocol_error("POST", &path, &format!("{e} in {body}"))
        })
    }

    /// A round's second step: the quote over the PCRs and nonce of `request` (TPM2_Quote with
    /// the AK, through the daemon) and the UEFI event log if asked for.
    ///
    /// # Errors
    /// [`KeylimeError::Vault`] when the daemon refuses or fails the quote;
    /// [`KeylimeError::Protocol`] for a PCR selection the daemon cannot express.
    pub async fn collect(&mut self, request: &EvidenceRequest) -> Result<Evidence, KeylimeError> {
        let what = format!("{API}/agents/{}/attestations", self.config.uuid);
        let mut items = Vec::new();
        let mut quoted = Vec::new();
        if let Some(q) = &request.quote {
            let binding: PcrBinding = format!("sha256:{}", join(&q.pcrs))
                .parse()
                .map_err(|e| protocol_error("POST", &what, &format!("selected PCRs: {e}")))?;
            let quote = self.client.quote_with(AkAlg::Rsa2048, &binding, &q.challenge).await?;
            items.push(protocol::quote_evidence(&quote).map_err(|e| protocol_error("POST", &what, &e))?);
            quoted = q.pcrs.clone();
        }
        let mut sent_event_log = false;
        if request.uefi_log {
            let log = match self.log.take() {
                Some(log) => Some(log),
                None => self.event_log().await?,
            };
            if let Some(log) = log {
                items.push(protocol::uefi_log_evidence(&log));
                sent_event_log = true;
            }
        }
        Ok(Evidence { index: request.index.clone(), body: protocol::evidence(items), pcrs: quoted, sent_event_log })
    }

    /// A round's last step: sends `evidence` to the verifier, which then checks it (the
    /// outcome, pass or fail, is the verifier's to publish, not an answer to this request).
    ///
    /// # Errors
    /// [`KeylimeError::Refused`]: 400 when the evidence is not what was asked for, 403 when
    /// the attestation does not await evidence (it was already answered, or it expired);
    /// others as for any request.
    pub async fn submit(&mut self, evidence: &Evidence) -> Result<Round, KeylimeError> {
        let token = self.token.as_ref().map(|t| t.as_str().to_owned());
        let path = format!("{API}/agents/{}/attestations/latest", self.config.uuid);
        let r = self.verifier.send(Method::PATCH, &path, Some(&evidence.body), token.as_deref()).await?;
        let r = expect_ok(r, "PATCH", &path)?;
        let index = EvidenceRequest::parse_index(&r.body).unwrap_or_else(|| evidence.index.clone());
        let seconds_to_next = r.body.pointer("/meta/seconds_to_next_attestation").and_then(Value::as_f64);
        let round = Round {
            index,
            seconds_to_next: seconds_to_next.map(|s| s.max(0.0).ceil() as u64),
            pcrs: evidence.pcrs.clone(),
            sent_event_log: evidence.sent_event_log,
        };
        self.record(&round);
        Ok(round)
    }

    /// The daemon's UEFI event log, or `None` when it serves none.
    async fn event_log(&mut self) -> Result<Option<Vec<u8>>, KeylimeError> {
        match self.client.event_log().await {
            Ok((log, _)) => Ok(Some(log)),
            Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs until `shutdown`: registers (retrying while the registrar is unreachable), then
    /// attests at the interval the verifier sets, waiting as told on 429/503, backing off while
    /// the verifier is unreachable, and re-registering when the verifier no longer accepts the
    /// AK (after the registrar lost it, or the TPM was reset and the AK re-created).
    ///
    /// # Errors
    /// Only for what retrying cannot fix: a registrar that refuses this TPM for this UUID
    /// (403), or a daemon that refuses the agent (`PermissionDenied`).
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), KeylimeError> {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::default();
        let mut registered = false;
        loop {
            let wait = if registered {
                match self.attest_once().await {
                    Ok(round) => {
                        backoff.reset();
                        let verifier = round.seconds_to_next.map(Duration::from_secs);
                        let wait = verifier.unwrap_or(DEFAULT_INTERVAL).max(self.config.interval.unwrap_or_default());
                        note(&format!(
                            "attestation {}: evidence accepted by the verifier (PCRs {}{}); next round in {} s",
                            round.index,
                            join(&round.pcrs),
                            if round.sent_event_log { ", UEFI event log" } else { "" },
                            wait.as_secs()
                        ));
                        wait
                    }
                    Err(e) => {
                        if matches!(e, KeylimeError::SessionRefused { .. }) {
                            // The verifier may not know this AK: register it again.
                            registered = false;
                        }
                        self.wait_after(&e, &mut backoff)?
                    }
                }
            } else {
                match self.register().await {
                    Ok(()) => {
                        registered = true;
                        backoff.reset();
                        Duration::ZERO
                    }
                    Err(e) => self.wait_after(&e, &mut backoff)?,
                }
            };
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to wait after `e`, or the error itself when waiting cannot help.
    fn wait_after(&self, e: &KeylimeError, backoff: &mut Backoff) -> Result<Duration, KeylimeError> {
        if let KeylimeError::Vault(v) = e {
            if v.code() == tonic::Code::PermissionDenied {
                return Err(KeylimeError::Config(format!(
                    "{e} (the access policy must grant this user the `quote` operation)"
                )));
            }
        }
        if let KeylimeError::Refused { status, request, .. } = e {
            if *status == StatusCode::FORBIDDEN && request.contains("/agents/") && !request.contains("attestations") {
                return Err(KeylimeError::Config(format!("{e}")));
            }
        }
        let wait = match e.retry_after() {
            Some(d) => d,
            None => backoff.next(self.config.interval.unwrap_or(DEFAULT_INTERVAL)),
        };
        note(&format!("{e}; retrying in {} s", wait.as_secs()));
        Ok(wait)
    }

    /// Writes `status.json` (last round, when) into the state directory, if there is one.
    fn record(&self, round: &Round) {
        let Some(dir) = &self.config.state_dir else { return };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let status = serde_json::json!({
            "uuid": self.config.uuid,
            "verifier": self.config.verifier,
            "last_round": { "index": round.index, "at_unix": now, "pcrs": round.pcrs,
                            "event_log": round.sent_event_log, "seconds_to_next": round.seconds_to_next },
        });
        let tmp = dir.join(".status.json.tmp");
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, format!("{status:#}\n")))
            .and_then(|()| std::fs::rename(&tmp, dir.join("status.json")));
        if let Err(e) = written {
            note(&format!("cannot record the agent's status in {}: {e}", dir.display()));
        }
    }
}

/// Exponential backoff from 1 s up to the interval.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    since: Option<Instant>,
}

impl Backoff {
    fn next(&mut self, cap: Duration) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.since.get_or_insert_with(Instant::now);
        Duration::from_secs(1u64 << self.failures.min(10).saturating_sub(1)).min(cap.max(Duration::from_secs(1)))
    }

    fn reset(&mut self) {
        *self = Self::default();
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn join(pcrs: &[u32]) -> String {
    pcrs.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The device's boot time (`btime` in /proc/stat), RFC 3339: Keylime orders attestations by it.
fn boot_time() -> String {
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<i64>().ok())))
        .unwrap_or(0);
    let t = time::OffsetDateTime::from_unix_timestamp(btime).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// A line on stderr (the journal, under systemd): the agent's log.
fn note(line: &str) {
    eprintln!("tpm-vault keylime-agent: {line}");
}

/// `r` when its status is 2xx, else the error it describes.
fn expect_ok(r: JsonResponse, method: &str, path: &str) -> Result<JsonResponse, KeylimeError> {
    if r.status.is_success() {
        return Ok(r);
    }
    Err(KeylimeError::Refused {
        request: format!("{method} {path}"),
        status: r.status,
        detail: protocol::error_detail(&r.body),
        retry_after: r.retry_after,
    })
}

fn protocol_error(method: &str, path: &str, reason: &str) -> KeylimeError {
    KeylimeError::Protocol { request: format!("{method} {path}"), reason: reason.to_owned() }
}
