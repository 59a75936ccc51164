//! The TPM connection: the ESAPI context and everything that hangs off it, and every command.
//!
//! A [`Tpm`] lives on the actor thread ([`super::actor`]), which runs its commands one at a
//! time, in the order jobs arrive. It owns the connection (and reconnects with backoff after the TPM went away), the
//! storage root key, one long-lived salted HMAC session with parameter encryption, and an LRU
//! of loaded key objects bounded so the TPM never runs out of object slots. It knows nothing of
//! files, names or gRPC: callers hand it key blobs and get TPM results back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tss_esapi::attributes::SessionAttributesBuilder;
use tss_esapi::constants::{CapabilityType, PropertyTag, SessionType, StartupType};
use tss_esapi::handles::{KeyHandle, ObjectHandle, PersistentTpmHandle, TpmHandle as RawTpmHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{
    Auth, CapabilityData, Data, Digest, EncryptedSecret, Private, Public, PublicBuffer, SensitiveData, Signature,
    SignatureScheme, SymmetricDefinition, SymmetricDefinitionObject,
};
use tss_esapi::traits::{Marshall, UnMarshall};
use tss_esapi::{Context, TctiNameConf};

use super::error::{rc, wrap, ResponseCode, TpmError};
use super::object::{self, KeyBlob};
use super::shared::{DaState, Shared, TpmInfo, TpmState};
use super::templates;
use super::{convert, pcr, software};
use crate::model::{HashAlg, KeyAlg, PcrBank, PcrSelection, Scheme};
use crate::store::TpmObject;

/// First transient handle (TPM_HT_TRANSIENT << 24).
const TRANSIENT_FIRST: u32 = 0x8000_0000;
/// Attempts for commands answered with RETRY/YIELDED/TESTING.
const MAX_RETRIES: u32 = 5;
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How to satisfy a policy-protected object's authPolicy in a policy session.
#[derive(Clone)]
pub enum PolicyAuth {
    /// `TPM2_PolicyPCR` over these PCRs with their current values; the object's policy fixes
    /// the values it accepts.
    Pcr(PcrSelection),
    /// `TPM2_PolicyPCR` (current values), then `TPM2_PolicyAuthorize` with an approval signed
    /// by the authority key.
    Authorized {
        /// PCRs the approval covers.
        selection: PcrSelection,
        /// Authority public key (ECC P-256), loaded into the owner hierarchy to check the
        /// approval's signature.
        authority: p256::PublicKey,
        /// The approved PolicyPCR digest.
        approved_policy: Vec<u8>,
        /// Policy reference the approval was signed with.
        policy_ref: Vec<u8>,
        /// Approval signature over `SHA-256(approved_policy || policy_ref)`.
        signature: p256::ecdsa::Signature,
    },
}

impl std::fmt::Debug for PolicyAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pcr(sel) => write!(f, "PolicyAuth::Pcr({sel})"),
            Self::Authorized { selection, .. } => write!(f, "PolicyAuth::Authorized({selection})"),
        }
    }
}

/// What stands between the vault and the TPM, which decides what is cheap: see
/// [`ResourceManager::detect`] and `docs/CONFIG.md` (`resource_manager`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceManager {
    /// None: the vault owns the TPM's few object slots (swtpm, `/dev/tpm0`). Loaded keys cost
    /// nothing between commands, so up to `max_loaded_objects` stay loaded, and the salted
    /// HMAC session is kept for the next command that carries a secret.
    None,
    /// The kernel's (`/dev/tpmrm0`, or a model of it): 3 object and 3 session slots per open
    /// file, and every object and session the file holds is ContextLoaded before and
    /// ContextSaved (objects also flushed) after every command. Each object kept loaded costs 3
    /// TPM commands on every command, a kept session 2: the vault keeps one key loaded (a
    /// signature with the hot key is then ContextLoad, Sign, ContextSave, FlushContext), makes
    /// the SRK persistent when it can (a persistent handle is outside the space: free), and
    /// flushes a session after the operation that needed it. Running out of slots there makes
    /// the TCTI fail with an I/O error, which the vault recovers from by reopening the device.
    Kernel,
    /// A user-space one (tpm2-abrmd, TCTI `tabrmd:`): it loads only the objects a command names,
    /// so kept objects cost nothing on other commands; its per-client limit is learned from its
    /// out-of-memory answer.
    UserSpace,
}

impl ResourceManager {
    /// The resource manager a TCTI string reaches: `device:/dev/tpmrm*` the kernel's,
    /// `tabrmd` tpm2-abrmd, anything else none.
    pub fn detect(tcti: &str) -> Self {
        let (name, conf) = tcti.split_once(':').unwrap_or((tcti, ""));
        match name {
            "device" if conf.starts_with("/dev/tpmrm") => Self::Kernel,
            // The device TCTI's default device is /dev/tpm0 (no resource manager).
            "tabrmd" => Self::UserSpace,
            _ => Self::None,
        }
    }

    /// The name `status` and the logs show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Kernel => "kernel",
            Self::UserSpace => "tabrmd",
        }
    }
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// TCTI string.
    pub tcti: String,
    /// The resource manager in front of the TPM (decides what stays loaded).
    pub resource_manager: ResourceManager,
    /// Most transient objects kept loaded, the SRK included (at least 2). Behind the kernel's
    /// resource manager the vault keeps one key loaded whatever this says.
    pub max_loaded: usize,
    /// SRK name recorded in the state dir; `None` on first start.
    pub expected_srk_name: Option<Vec<u8>>,
}

/// A live connection and what hangs off it.
struct Conn {
    ctx: Context,
    srk: KeyHandle,
    /// Whether the SRK is a transient object this connection must flush.
    srk_transient: bool,
    /// Salted HMAC session with parameter encryption, reused for commands that carry secrets.
    hmac: Option<AuthSession>,
    loaded: Lru,
    /// How many user keys may be loaded at once (the object budget minus the SRK).
    max_keys: usize,
    /// Set when the resource manager ran out of slots with fewer keys loaded than `max_keys`
    /// (see [`Conn::out_of_slots`]): the budget learned, for the next connection too.
    learned_max_keys: Option<usize>,
    info: TpmInfo,
    /// PCR values last read on this connection (see [`pcr::PcrCache`]).
    pcrs: pcr::PcrCache,
}

/// Loaded key objects by TPM name, least recently used first out.
#[derive(Default)]
struct Lru {
    map: HashMap<Vec<u8>, (KeyHandle, u64)>,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, name: &[u8]) -> Option<KeyHandle> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(name).map(|e| {
            e.1 = tick;
            e.0
        })
    }

    fn insert(&mut self, name: Vec<u8>, handle: KeyHandle) {
        self.tick += 1;
        self.map.insert(name, (handle, self.tick));
    }

    fn pop_oldest(&mut self) -> Option<KeyHandle> {
        let oldest = self.map.iter().min_by_key(|(_, (_, t))| *t).map(|(n, _)| n.clone())?;
        self.map.remove(&oldest).map(|(h, _)| h)
    }
}

impl std::fmt::Debug for Tpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tpm")
            .field("tcti", &self.cfg.tcti)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

/// The connection's state. Lives on the TPM (actor) thread only.
pub struct Tpm {
    cfg: ConnectionConfig,
    conn: Option<Conn>,
    next_attempt: Instant,
    backoff: Duration,
    shared: Arc<Shared>,
    /// Set while the TPM is refused (SRK mismatch): every request gets this error, not a
    /// generic "unavailable", until a reconnect finds the right TPM again.
    refused: Option<TpmError>,
    /// The most keys the resource manager held for the vault when it ran out of slots (see
    /// [`Conn::out_of_slots`]); kept across reconnects.
    learned_max_keys: Option<usize>,
}

impl Tpm {
    /// Connects, loads or creates the SRK and checks it against the recorded name.
    ///
    /// # Errors
    /// [`TpmError::Unavailable`] if the TPM cannot be reached, [`TpmError::SrkMismatch`] if it
    /// is not the TPM the state directory belongs to.
    pub fn open(cfg: ConnectionConfig, shared: Arc<Shared>) -> Result<(Self, TpmInfo), TpmError> {
        let mut tpm = Self {
            cfg,
            conn: None,
            next_attempt: Instant::now(),
            backoff: BACKOFF_MIN,
            shared,
            refused: None,
            learned_max_keys: None,
        };
        tpm.connect()?;
        let info = tpm.conn.as_ref().map(|c| c.info.clone()).unwrap_or_default();
        if tpm.cfg.expected_srk_name.is_none() {
            tpm.cfg.expected_srk_name = Some(info.srk_name.clone());
        }
        Ok((tpm, info))
    }

    fn connect(&mut self) -> Result<(), TpmError> {
        let result = self.try_connect();
        match &result {
            Ok(info) => {
                self.backoff = BACKOFF_MIN;
                self.refused = None;
                self.shared.set_state(TpmState::Ready, None, Some(info.clone()));
                self.shared.count_connect();
                // The dictionary-attack gauges start with the TPM's state at connect.
                if let Some(da) = self.conn.as_mut().and_then(|c| c.da_state().ok()) {
                    self.shared.set_da(da);
                }
                tracing::info!(srk = %hex::encode(&info.srk_name), manufacturer = %info.manufacturer, "TPM connected");
            }
            Err(e @ TpmError::SrkMismatch { .. }) => {
                tracing::error!(error = %e, "refusing this TPM");
                self.shared.set_state(TpmState::Mismatch, Some(e.to_string()), None);
                self.refused = Some(e.clone());
                self.schedule_retry();
            }
            Err(e) => {
                self.shared.set_state(TpmState::Down, Some(e.to_string()), None);
                self.schedule_retry();
            }
        }
        result.map(|_| ())
    }

    fn schedule_retry(&mut self) {
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    fn try_connect(&mut self) -> Result<TpmInfo, TpmError> {
        let tcti: TctiNameConf =
            self.cfg.tcti.parse().map_err(|e| TpmError::Unavailable(format!("bad TCTI {:?}: {e}", self.cfg.tcti)))?;
        let mut ctx = Context::new(tcti)
            .map_err(|e| TpmError::Unavailable(format!("open TCTI: {e}{}", device_access_hint(&self.cfg.tcti))))?;
        let manufacturer = match ctx.get_tpm_property(tss_esapi::constants::PropertyTag::Manufacturer) {
            Ok(v) => v,
            Err(e) if ResponseCode::of(&e).and_then(|r| r.tpm_code()) == Some(rc::INITIALIZE) => {
                ctx.startup(StartupType::Clear).map_err(wrap("TPM2_Startup"))?;
                ctx.get_tpm_property(tss_esapi::constants::PropertyTag::Manufacturer)
                    .map_err(wrap("TPM2_GetCapability"))?
            }
            Err(e) => return Err(TpmError::from_tss("TPM2_GetCapability", e)),
        };
        let fw1 = ctx
            .get_tpm_property(tss_esapi::constants::PropertyTag::FirmwareVersion1)
            .map_err(wrap("TPM2_GetCapability"))?
            .unwrap_or(0);
        let manufacturer = manufacturer
            .map(|m| m.to_be_bytes().iter().filter(|b| b.is_ascii_graphic()).map(|&b| b as char).collect())
            .unwrap_or_default();
        let mut vendor = Vec::with_capacity(4);
        for tag in [
            PropertyTag::VendorString1,
            PropertyTag::VendorString2,
            PropertyTag::VendorString3,
            PropertyTag::VendorString4,
        ] {
            vendor.push(ctx.get_tpm_property(tag).map_err(wrap("TPM2_GetCapability"))?);
        }
        let vendor = software::vendor_string(&vendor);
        flush_leftovers(&mut ctx, self.cfg.resource_manager == ResourceManager::None);
        let persist = self.cfg.resource_manager == ResourceManager::Kernel;
        let (srk, srk_transient) = Self::load_srk(&mut ctx, persist)?;
        let (_, srk_name, _) = ctx.read_public(srk).map_err(wrap("TPM2_ReadPublic"))?;
        let srk_name = srk_name.value().to_vec();
        let info = TpmInfo {
            srk_name: srk_name.clone(),
            manufacturer,
            firmware: format!("{fw1:08x}"),
            vendor,
            srk_persistent: !srk_transient,
        };
        if let Some(expected) = &self.cfg.expected_srk_name {
            if *expected != srk_name {
                if srk_transient {
                    let _ = ctx.flush_context(srk.into());
                }
                return Err(TpmError::SrkMismatch { expected: hex::encode(expected), found: hex::encode(&srk_name) });
            }
        }
        let configured = match self.cfg.resource_manager {
            // Each object kept in a /dev/tpmrm0 space costs 3 commands on every command: keep
            // only the hot key (see [`ResourceManager::Kernel`]).
            ResourceManager::Kernel => 1,
            ResourceManager::None | ResourceManager::UserSpace => {
                self.cfg.max_loaded.saturating_sub(usize::from(srk_transient)).max(1)
            }
        };
        let max_keys = self.learned_max_keys.map_or(configured, |learned| configured.min(learned));
        self.conn = Some(Conn {
            ctx,
            srk,
            srk_transient,
            hmac: None,
            loaded: Lru::default(),
            max_keys,
            learned_max_keys: None,
            info: info.clone(),
            pcrs: pcr::PcrCache::default(),
        });
        Ok(info)
    }

    /// Uses the SRK at the persistent handle if it is an ECC P-256 storage key, else derives the
    /// TCG template SRK as a transient object and, with `persist`, makes it persistent at that
    /// handle when the handle is free and the owner hierarchy's auth value is empty (else it
    /// stays transient: said in the log and in `status`).
    fn load_srk(ctx: &mut Context, persist: bool) -> Result<(KeyHandle, bool), TpmError> {
        let persistent = PersistentTpmHandle::new(templates::SRK_PERSISTENT_HANDLE).map_err(wrap("SRK handle"))?;
        let present = match ctx.get_capability(CapabilityType::Handles, templates::SRK_PERSISTENT_HANDLE, 1) {
            Ok((CapabilityData::Handles(list), _)) => {
                list.iter().any(|h| u32::from(*h) == templates::SRK_PERSISTENT_HANDLE)
            }
            _ => false,
        };
        let found = if present {
            ctx.execute_without_session(|c| c.tr_from_tpm_public(RawTpmHandle::Persistent(persistent))).ok()
        } else {
            None
        };
        if let Some(obj) = found {
            let handle = KeyHandle::from(obj);
            if let Ok((Public::Ecc { object_attributes, parameters, .. }, _, _)) = ctx.read_public(handle) {
                if object_attributes.restricted()
                    && object_attributes.decrypt()
                    && parameters.ecc_curve() == tss_esapi::interface_types::ecc::EccCurve::NistP256
                {
                    return Ok((handle, false));
                }
            }
            let mut obj = obj;
            let _ = ctx.tr_close(&mut obj);
        }
        let template = templates::srk()?;
        let created = ctx
            .execute_with_session(Some(AuthSession::Password), |c| {
                c.create_primary(Hierarchy::Owner, template, None, None, None, None)
            })
            .map_err(wrap("TPM2_CreatePrimary"))?;
        if persist && !present {
            let made = ctx.execute_with_session(Some(AuthSession::Password), |c| {
                c.evict_control(
                    tss_esapi::interface_types::resource_handles::Provision::Owner,
                    created.key_handle.into(),
                    tss_esapi::interface_types::dynamic_handles::Persistent::Persistent(persistent),
                )
            });
            match made {
                Ok(obj) => {
                    let _ = ctx.flush_context(created.key_handle.into());
                    tracing::info!(
                        handle = format_args!("{:#x}", templates::SRK_PERSISTENT_HANDLE),
                        "made the SRK persistent: behind the kernel's resource manager it then costs no \
                         command per command"
                    );
                    return Ok((KeyHandle::from(obj), false));
                }
                Err(e) => tracing::info!(
                    error = %TpmError::from_tss("TPM2_EvictControl", e),
                    "the SRK stays transient (the owner hierarchy has an auth value, or NV is full): \
                     behind the kernel's resource manager that costs 3 TPM commands on every command"
                ),
            }
        }
        Ok((created.key_handle, true))
    }

    /// Runs `f` against a live connection: reconnects first if needed (respecting backoff),
    /// retries commands the TPM asked to retry, and drops the connection when it broke.
    fn with_conn<T>(&mut self, mut f: impl FnMut(&mut Conn) -> Result<T, TpmError>) -> Result<T, TpmError> {
        if self.conn.is_none() {
            if Instant::now() < self.next_attempt {
                if let Some(refused) = &self.refused {
                    return Err(refused.clone());
                }
                return Err(TpmError::Unavailable(self.shared.last_error().unwrap_or_else(|| "reconnecting".into())));
            }
            self.connect()?;
        }
        let mut attempt = 0;
        let mut reset_retried = false;
        let mut slots_retried = false;
        let kernel = self.cfg.resource_manager == ResourceManager::Kernel;
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Err(TpmError::Unavailable("connection lost".into()));
            };
            let result = f(conn);
            if let Some(learned) = conn.learned_max_keys {
                self.learned_max_keys = Some(learned);
            }
            let held = conn.loaded.map.len();
            if kernel && !result.as_ref().is_err_and(TpmError::is_connection_lost) {
                // A session kept in a /dev/tpmrm0 space costs 2 commands on every command.
                conn.forget_hmac_session();
            }
            match result {
                Err(e) if kernel && e.is_connection_lost() && !slots_retried => {
                    // Behind the kernel's resource manager, running out of the file's object or
                    // session slots fails write() with -ENOMEM: the TCTI answers an I/O error
                    // and ESYS leaves its context unusable. A TPM that is really gone fails
                    // the reopen below; else this was out of slots: reopen the device (a
                    // fresh space), keep fewer keys loaded, and run the operation once more.
                    slots_retried = true;
                    let keep = held.saturating_sub(1).max(1);
                    if held > 1 {
                        self.learned_max_keys = Some(keep);
                    }
                    tracing::warn!(
                        error = %e,
                        keys_loaded = held,
                        keep,
                        "the TPM connection failed behind the kernel's resource manager (out of slots?): reopening it"
                    );
                    if let Some(conn) = self.conn.take() {
                        drop_quietly(conn);
                    }
                    self.connect()?;
                }
                Err(TpmError::Busy(why)) if attempt + 1 < MAX_RETRIES => {
                    attempt += 1;
                    tracing::debug!(%why, attempt, "TPM asked to retry");
                    std::thread::sleep(Duration::from_millis(10 * u64::from(attempt)));
                }
                Err(TpmError::Reset(why)) if !reset_retried => {
                    // The TPM forgot our handles: reconnect now (re-checking the SRK, which
                    // catches a cleared TPM) and run the operation once more.
                    tracing::warn!(%why, "TPM was reset under the vault; reconnecting");
                    reset_retried = true;
                    if let Some(conn) = self.conn.take() {
                        drop_quietly(conn);
                    }
                    self.connect()?;
                }
                Err(e) if e.is_connection_lost() => {
                    tracing::warn!(error = %e, "lost the TPM; will reconnect");
                    if let Some(conn) = self.conn.take() {
                        // Handles died with the connection; forget them without talking to the TPM.
                        drop_quietly(conn);
                    }
                    self.shared.set_state(TpmState::Down, Some(e.to_string()), None);
                    self.schedule_retry();
                    return Err(e);
                }
                Err(TpmError::Lockout(_)) => {
                    let da = self.conn.as_mut().and_then(|c| c.da_state().ok());
                    if let Some(da) = da {
                        self.shared.set_da(da);
                    }
                    let detail = da.map(|d| super::error::lockout_detail(d.failures, d.max_tries, d.interval_s));
                    return Err(TpmError::Lockout(detail.unwrap_or_default()));
                }
                other => return other,
            }
        }
    }

    /// Creates an object under the SRK through the salted, parameter-encrypting HMAC session
    /// (the auth value and any sensitive data never cross the bus in clear).
    ///
    /// # Errors
    /// TPM errors, classified.
    fn create(
        &mut self,
        template: Public,
        auth: Option<Auth>,
        sensitive: Option<SensitiveData>,
    ) -> Result<TpmObject, TpmError> {
        self.with_conn(|conn| loop {
            // TPM2_Create needs an object slot of its own while it runs: with the key budget
            // full, make room first rather than after a failed command (an fTPM command costs
            // milliseconds).
            if conn.loaded.map.len() >= conn.max_keys {
                conn.evict_oldest();
            }
            let session = conn.hmac_session()?;
            let srk = conn.srk;
            let result = conn.ctx.execute_with_session(Some(session), |c| {
                c.create(srk, template.clone(), auth.clone(), sensitive.clone(), None, None)
            });
            match conn.check_session(result.map_err(wrap("TPM2_Create"))) {
                // TPM2_Create needs a free object slot of its own: make room and try again.
                Err(TpmError::ObjectMemory) if conn.out_of_slots() => continue,
                Err(e) => return Err(e),
                Ok(created) => return object::stored(created.out_public, &created.out_private),
            }
        })
    }

    /// Creates a signing key of `alg` (ECC or RSA) under the SRK, with a password (`auth`) or
    /// bound to a policy digest (`auth_policy`), or neither.
    ///
    /// # Errors
    /// TPM errors, classified; [`TpmError::Malformed`] for an `alg` the TPM has no key for or
    /// a digest or password the TPM cannot take.
    pub fn create_key(
        &mut self,
        alg: KeyAlg,
        auth_policy: Option<&[u8]>,
        auth: Option<&[u8]>,
    ) -> Result<TpmObject, TpmError> {
        let policy = auth_policy.map(|d| Digest::try_from(d.to_vec()).map_err(wrap("policy digest"))).transpose()?;
        let auth = auth.map(|a| Auth::try_from(a.to_vec()).map_err(wrap("auth value"))).transpose()?;
        let template = templates::signing_key(alg, policy, auth.is_some())?;
        self.create(template, auth, None)
    }

    /// Creates the attestation key (a restricted ECC P-256 signing key) under the SRK.
    ///
    /// # Errors
    /// TPM errors, classified.
    pub fn create_attestation_key(&mut self) -> Result<TpmObject, TpmError> {
        self.create(templates::attestation_key()?, None, None)
    }

    /// Creates the RSA 2048 attestation key (RSASSA-SHA256) under the SRK.
    ///
    /// # Errors
    /// TPM errors.
    pub fn create_attestation_key_rsa(&mut self) -> Result<TpmObject, TpmError> {
        self.create(templates::attestation_key_rsa()?, None, None)
    }

    /// Seals `key` in a new sealed-data object under the SRK: bound to `auth_policy` (a
    /// PolicyPCR or PolicyAuthorize digest), or usable without a policy when `None`. Created
    /// through the encrypted session, so the key never crosses the TPM interface in clear.
    ///
    /// # Errors
    /// TPM errors, classified; [`TpmError::Malformed`] for a digest or key the TPM cannot take.
    pub fn seal_key(&mut self, auth_policy: Option<&[u8]>, key: &[u8]) -> Result<TpmObject, TpmError> {
        let template = match auth_policy {
            Some(digest) => templates::sealed(Digest::try_from(digest.to_vec()).map_err(wrap("policy digest"))?)?,
            None => templates::sealed_unbound()?,
        };
        // The TSS buffer wipes its copy when dropped.
        let sensitive = SensitiveData::try_from(key.to_vec()).map_err(wrap("sealed data"))?;
        self.create(template, None, Some(sensitive))
    }

    /// Runs a [`SignJob`]: signs its digest with its key (loaded on demand) and returns the
    /// signature encoded as the key's algorithm is (DER ECDSA-Sig-Value, RSA bytes). Keys
    /// without a password or policy sign through a plain password session: nothing secret moves
    /// and it costs one command. Password-protected keys use the encrypted HMAC session;
    /// PCR-bound keys a policy session.
    ///
    /// # Errors
    /// TPM errors, classified; [`TpmError::Malformed`] for a digest or password the TPM cannot
    /// take.
    pub fn sign(&mut self, job: &SignJob) -> Result<Vec<u8>, TpmError> {
        let ticket = convert::null_hashcheck()?;
        let digest = Digest::try_from(job.digest.clone()).map_err(wrap("digest"))?;
        let scheme = convert::signature_scheme(job.scheme, job.hash);
        let auth = job.auth.as_ref().map(|a| Auth::try_from(a.to_vec()).map_err(wrap("auth value"))).transpose()?;
        let key = &job.key;
        let signature = self.with_conn(|conn| {
            let handle = conn.load(key)?;
            if let Some(policy) = &job.policy {
                let session = conn.policy_session(policy, false)?;
                let result = conn
                    .ctx
                    .execute_with_session(Some(session), |c| c.sign(handle, digest.clone(), scheme, ticket.clone()));
                conn.flush_session(session);
                return result.map_err(wrap("TPM2_Sign"));
            }
            let session = match &auth {
                None => AuthSession::Password,
                Some(a) => {
                    conn.ctx.tr_set_auth(handle.into(), a.clone()).map_err(wrap("Esys_TR_SetAuth"))?;
                    conn.hmac_session()?
                }
            };
            let result = conn
                .ctx
                .execute_with_session(Some(session), |c| c.sign(handle, digest.clone(), scheme, ticket.clone()));
            if auth.is_some() {
                // Do not leave the password attached to a cached handle.
                let _ = conn.ctx.tr_set_auth(handle.into(), Auth::default());
                conn.check_session(result.map_err(wrap("TPM2_Sign")))
            } else {
                result.map_err(wrap("TPM2_Sign"))
            }
        })?;
        convert::encode_signature(job.alg, &signature)
    }

    /// Unseals a sealed data object through a salted policy session with response encryption,
    /// so the secret never crosses the TPM interface in clear.
    ///
    /// # Errors
    /// [`TpmError::PolicyFailed`] when the PCRs (or the approval) do not satisfy the object's
    /// policy; other TPM errors, classified.
    pub fn unseal(
        &mut self,
        blob: &KeyBlob,
        policy: Option<&PolicyAuth>,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, TpmError> {
        self.with_conn(|conn| {
            let result = match policy {
                Some(policy) => {
                    // The policy first: an authorized policy loads the authority's key, which
                    // may need to evict loaded keys; the sealed object comes after.
                    let session = conn.policy_session(policy, true)?;
                    let handle = match conn.load(blob) {
                        Ok(h) => h,
                        Err(e) => {
                            conn.flush_session(session);
                            return Err(e);
                        }
                    };
                    let r = conn.ctx.execute_with_session(Some(session), |c| c.unseal(handle.into()));
                    conn.flush_session(session);
                    r
                }
                None => {
                    let handle = conn.load(blob)?;
                    // No policy: the object's empty auth value, through the salted HMAC session
                    // whose response encryption hides the data.
                    let session = conn.hmac_session()?;
                    let r = conn.ctx.execute_with_session(Some(session), |c| c.unseal(handle.into()));
                    if r.is_err() {
                        conn.forget_hmac_session();
                    }
                    r
                }
            };
            // Sealed objects are used once per unseal: do not keep them in the key LRU.
            conn.evict(&blob.name);
            let data = result.map_err(wrap("TPM2_Unseal"))?;
            Ok(zeroize::Zeroizing::new(data.value().to_vec()))
        })
    }

    /// Quotes `sel` with the attestation key over `nonce` and returns the PCR values with it:
    /// the values remembered from the last read if they hash to the quoted digest (the usual
    /// case: one TPM command), else freshly read ones, re-quoting (up to 3 times) until they
    /// hash to it. Either way the returned values are exactly the quoted ones.
    ///
    /// # Errors
    /// TPM errors; [`TpmError::Busy`] if the PCRs kept changing.
    pub fn quote(
        &mut self,
        ak: &KeyBlob,
        nonce: &[u8],
        sel: &PcrSelection,
    ) -> Result<(super::attest::Quote, Vec<Vec<u8>>), TpmError> {
        self.with_conn(|conn| {
            let handle = conn.load(ak)?;
            let matches =
                |values: &[Vec<u8>], digest: &[u8]| crate::model::HashAlg::Sha256.digest(&values.concat()) == digest;
            for _ in 0..3 {
                let quote = super::attest::quote(&mut conn.ctx, handle, nonce, sel)?;
                // While the PCRs do not change, the values read for the last quote hash to this
                // one's digest: one TPM command per quote.
                if let Some(values) = conn.pcrs.get(sel).filter(|v| matches(v, &quote.pcr_digest)) {
                    return Ok((quote, values));
                }
                let (_, values) = pcr::read(&mut conn.ctx, sel)?;
                conn.pcrs.put(sel, &values);
                if matches(&values, &quote.pcr_digest) {
                    return Ok((quote, values));
                }
                tracing::debug!("PCRs changed during the quote; quoting again");
            }
            Err(TpmError::Busy("PCRs kept changing during the quote".into()))
        })
    }

    /// The EK public area and certificate (if the TPM has one). Needs a free object slot for
    /// the EK, so loaded keys are flushed first (this is a rare call).
    ///
    /// # Errors
    /// TPM errors.
    pub fn endorsement(&mut self) -> Result<(Public, Option<Vec<u8>>), TpmError> {
        self.with_conn(|conn| {
            while conn.evict_oldest() {}
            let public = super::attest::ek_public(&mut conn.ctx)?;
            let cert = super::attest::ek_certificate(&mut conn.ctx)?;
            Ok((public, cert))
        })
    }

    /// TPM2_ActivateCredential with the AK and the EK, through a session salted with the SRK
    /// that encrypts the recovered secret on its way out of the TPM.
    ///
    /// # Errors
    /// [`TpmError::CredentialRejected`]; other TPM errors.
    pub fn activate_credential(
        &mut self,
        ak: &KeyBlob,
        blob: &[u8],
        secret: &[u8],
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, TpmError> {
        self.with_conn(|conn| {
            while conn.evict_oldest() {}
            let handle = conn.load(ak)?;
            super::attest::activate_credential(&mut conn.ctx, conn.srk, handle, blob, secret)
        })
    }

    /// TPM2_Certify of the attestation key by itself over `nonce` (proof of possession).
    ///
    /// # Errors
    /// TPM errors.
    pub fn certify_attestation_key(&mut self, ak: &KeyBlob, nonce: &[u8]) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
        self.with_conn(|conn| {
            let handle = conn.load(ak)?;
            super::attest::certify_self(&mut conn.ctx, handle, nonce)
        })
    }

    /// `n` bytes from the TPM's RNG (for seeding only: a firmware TPM gives ~2 KB/s).
    ///
    /// # Errors
    /// TPM errors.
    pub fn get_random(&mut self, n: usize) -> Result<Vec<u8>, TpmError> {
        self.with_conn(|conn| {
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let want = (n - out.len()).min(32);
                let d = conn.ctx.execute_without_session(|c| c.get_random(want)).map_err(wrap("TPM2_GetRandom"))?;
                if d.value().is_empty() {
                    return Err(TpmError::Malformed("TPM2_GetRandom returned nothing".into()));
                }
                out.extend_from_slice(d.value());
            }
            out.truncate(n);
            Ok(out)
        })
    }

    /// Reads PCR values (selection order) and the PCR update counter.
    ///
    /// # Errors
    /// TPM errors.
    pub fn pcr_read(&mut self, sel: &PcrSelection) -> Result<(u32, Vec<Vec<u8>>), TpmError> {
        self.with_conn(|conn| {
            let (counter, values) = pcr::read(&mut conn.ctx, sel)?;
            conn.pcrs.put(sel, &values);
            Ok((counter, values))
        })
    }

    /// The TPM name of an external public key loaded into the owner hierarchy (what
    /// `TPM2_PolicyAuthorize` binds to).
    ///
    /// # Errors
    /// TPM errors.
    pub fn external_name(&mut self, key: &p256::PublicKey) -> Result<Vec<u8>, TpmError> {
        let public = authority_public(key)?;
        self.with_conn(|conn| {
            let handle = conn.load_external(&public)?;
            let name = conn.ctx.read_public(handle).map(|(_, n, _)| n.value().to_vec());
            let _ = conn.ctx.flush_context(handle.into());
            name.map_err(wrap("TPM2_ReadPublic"))
        })
    }

    /// The SRK's public area, marshalled as `TPM2B_PUBLIC` (what `tpm2_readpublic -o` writes).
    ///
    /// # Errors
    /// TPM errors.
    pub fn srk_public(&mut self) -> Result<Vec<u8>, TpmError> {
        self.with_conn(|conn| {
            let (public, _, _) = conn.ctx.read_public(conn.srk).map_err(wrap("TPM2_ReadPublic"))?;
            PublicBuffer::try_from(public).and_then(|b| b.marshall()).map_err(wrap("marshal SRK public"))
        })
    }

    /// TPM2_Certify: the (loaded) attestation key certifies the SRK over `nonce`. Returns the
    /// marshalled TPMS_ATTEST and TPMT_SIGNATURE.
    ///
    /// # Errors
    /// TPM errors; [`TpmError::Malformed`] for a nonce the TPM cannot take.
    pub fn certify_srk(&mut self, ak: &KeyBlob, nonce: &[u8]) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
        let data = Data::try_from(nonce.to_vec()).map_err(wrap("qualifying data"))?;
        self.with_conn(|conn| {
            let handle = conn.load(ak)?;
            let srk = conn.srk;
            let (attest, signature) = conn
                .ctx
                .execute_with_sessions((Some(AuthSession::Password), Some(AuthSession::Password), None), |c| {
                    c.certify(srk.into(), handle, data.clone(), SignatureScheme::Null)
                })
                .map_err(wrap("TPM2_Certify"))?;
            Ok((
                attest.marshall().map_err(wrap("marshal attest"))?,
                signature.marshall().map_err(wrap("marshal signature"))?,
            ))
        })
    }

    /// TPM2_Import of a duplicated object under the SRK (outer wrapper only, no inner
    /// wrapper): `public` is its `TPMT_PUBLIC`, `duplicate` the `TPM2B_PRIVATE` contents,
    /// `seed` the `TPM2B_ENCRYPTED_SECRET` contents. Returns the object re-wrapped by this TPM,
    /// stored like any the vault created.
    ///
    /// # Errors
    /// [`TpmError::ImportRejected`] when the TPM refuses the blob (another TPM's, altered, not
    /// importable); [`TpmError::Malformed`] for structures that do not decode; TPM errors.
    pub fn import(&mut self, public: &[u8], duplicate: &[u8], seed: &[u8]) -> Result<TpmObject, TpmError> {
        let public =
            Public::unmarshall(public).map_err(|e| TpmError::Malformed(format!("sealed object public area: {e}")))?;
        let duplicate = Private::try_from(duplicate.to_vec()).map_err(wrap("duplicate"))?;
        let seed = EncryptedSecret::try_from(seed.to_vec()).map_err(wrap("encrypted seed"))?;
        self.with_conn(|conn| {
            let srk = conn.srk;
            let private = conn
                .ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.import(
                        srk.into(),
                        None,
                        public.clone(),
                        duplicate.clone(),
                        seed.clone(),
                        SymmetricDefinitionObject::Null,
                    )
                })
                .map_err(TpmError::from_import)?;
            object::stored(public.clone(), &private)
        })
    }

    /// Reads the TPM's dictionary-attack state (one TPM2_GetCapability) and records it for the
    /// `tpm_vault_tpm_lockout_*` gauges.
    ///
    /// # Errors
    /// TPM errors; [`TpmError::Malformed`] when the TPM does not report the properties.
    pub fn da_state(&mut self) -> Result<DaState, TpmError> {
        let da = self.with_conn(Conn::da_state)?;
        self.shared.set_da(da);
        Ok(da)
    }

    /// The dictionary-attack reserve, checked right before a password attempt in the same actor
    /// job (so no other attempt can come in between): refuses while fewer than `reserve` of the
    /// TPM's tries remain. A reserve of 0 checks nothing.
    ///
    /// # Errors
    /// [`TpmError::DaReserve`]; the errors of [`Tpm::da_state`].
    pub fn check_da_reserve(&mut self, reserve: u32) -> Result<(), TpmError> {
        if reserve == 0 {
            return Ok(());
        }
        let da = self.da_state()?;
        if da.max_tries.saturating_sub(da.failures) < reserve {
            return Err(TpmError::DaReserve {
                failures: da.failures,
                max_tries: da.max_tries,
                interval_s: da.interval_s,
                reserve,
            });
        }
        Ok(())
    }

    /// Unloads the object with this TPM name if it is loaded (after a key is deleted).
    pub fn evict(&mut self, name: &[u8]) {
        if let Some(conn) = self.conn.as_mut() {
            conn.evict(name);
        }
    }

    /// Counts transient objects present in the TPM (all owners), for leak checks and status.
    ///
    /// # Errors
    /// TPM errors, classified.
    pub fn transient_handles(&mut self) -> Result<usize, TpmError> {
        self.with_conn(|conn| {
            let (data, _) = conn
                .ctx
                .get_capability(CapabilityType::Handles, TRANSIENT_FIRST, 64)
                .map_err(wrap("TPM2_GetCapability"))?;
            Ok(match data {
                CapabilityData::Handles(list) => list.len(),
                _ => 0,
            })
        })
    }

    /// Objects the vault holds loaded now, the SRK included when it is transient.
    pub fn loaded_objects(&self) -> usize {
        self.conn.as_ref().map_or(0, |c| c.loaded.map.len() + usize::from(c.srk_transient))
    }

    /// Extends PCR `index` of `bank` with `digest` (what a boot loader does with a
    /// measurement).
    ///
    /// # Errors
    /// TPM errors, classified.
    pub fn pcr_extend(&mut self, bank: PcrBank, index: u8, digest: &[u8]) -> Result<(), TpmError> {
        self.with_conn(|conn| pcr::extend(&mut conn.ctx, bank, index, digest))
    }

    /// Flushes everything the vault loaded (keys, session, transient SRK). Called at shutdown;
    /// the next operation reconnects.
    pub fn flush_all(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            while conn.evict_oldest() {}
            conn.forget_hmac_session();
            if conn.srk_transient {
                let _ = conn.ctx.flush_context(conn.srk.into());
            }
            tracing::debug!("flushed all TPM objects");
        }
        self.shared.set_loaded(0);
    }
}

impl Conn {
    /// The dictionary-attack properties, read in one TPM2_GetCapability (TPM_PT_LOCKOUT_COUNTER,
    /// TPM_PT_MAX_AUTH_FAIL and TPM_PT_LOCKOUT_INTERVAL are consecutive).
    fn da_state(&mut self) -> Result<DaState, TpmError> {
        use tss_esapi::constants::PropertyTag;
        let first: u32 = PropertyTag::LockoutCounter.into();
        let (data, _) =
            self.ctx.get_capability(CapabilityType::TpmProperties, first, 3).map_err(wrap("TPM2_GetCapability"))?;
        let CapabilityData::TpmProperties(list) = data else {
            return Err(TpmError::Malformed("TPM2_GetCapability returned no TPM properties".into()));
        };
        let prop = |tag| {
            list.find(tag)
                .map(|p| p.value())
                .ok_or_else(|| TpmError::Malformed(format!("the TPM does not report {tag:?}")))
        };
        Ok(DaState {
            failures: prop(PropertyTag::LockoutCounter)?,
            max_tries: prop(PropertyTag::MaxAuthFail)?,
            interval_s: prop(PropertyTag::LockoutInterval)?,
        })
    }

    /// Returns the loaded handle for `key`, loading it (and evicting the least recently used
    /// key when the slot budget is spent, or when the TPM says its object memory is full).
    fn load(&mut self, key: &KeyBlob) -> Result<KeyHandle, TpmError> {
        if let Some(h) = self.loaded.touch(&key.name) {
            return Ok(h);
        }
        let budget = self.max_keys;
        while self.loaded.map.len() >= budget && self.evict_oldest() {}
        let srk = self.srk;
        loop {
            let result = self
                .ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.load(srk, key.private.clone(), key.public.clone())
                })
                .map_err(wrap("TPM2_Load"));
            match result {
                Ok(h) => {
                    self.loaded.insert(key.name.clone(), h);
                    return Ok(h);
                }
                Err(TpmError::ObjectMemory) if self.out_of_slots() => {}
                Err(TpmError::ObjectMemory) => return Err(TpmError::ObjectMemory),
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts a policy session and runs the policy commands. `encrypt` salts the session with
    /// the SRK and turns on response-parameter encryption (for unseal).
    fn policy_session(&mut self, policy: &PolicyAuth, encrypt: bool) -> Result<AuthSession, TpmError> {
        let (salt, symmetric) = if encrypt {
            (Some(self.srk), SymmetricDefinition::AES_128_CFB)
        } else {
            (None, SymmetricDefinition::Null)
        };
        let session = self
            .ctx
            .start_auth_session(salt, None, None, SessionType::Policy, symmetric, HashingAlgorithm::Sha256)
            .map_err(wrap("TPM2_StartAuthSession"))?
            .ok_or_else(|| TpmError::Malformed("no session handle".into()))?;
        let result = self.run_policy(session, policy, encrypt);
        if result.is_err() {
            self.flush_session(session);
        }
        result.map(|()| session)
    }

    fn run_policy(&mut self, session: AuthSession, policy: &PolicyAuth, encrypt: bool) -> Result<(), TpmError> {
        if encrypt {
            let (attrs, mask) = SessionAttributesBuilder::new().with_encrypt(true).with_continue_session(true).build();
            self.ctx.tr_sess_set_attributes(session, attrs, mask).map_err(wrap("Esys_TRSess_SetAttributes"))?;
        }
        let policy_session = tss_esapi::interface_types::session_handles::PolicySession::try_from(session)
            .map_err(wrap("policy session"))?;
        let selection = match policy {
            PolicyAuth::Pcr(sel) | PolicyAuth::Authorized { selection: sel, .. } => sel,
        };
        let list = pcr::selection_list(selection)?;
        self.ctx
            .execute_without_session(|c| c.policy_pcr(policy_session, Digest::default(), list))
            .map_err(wrap("TPM2_PolicyPCR"))?;
        if let PolicyAuth::Authorized { authority, approved_policy, policy_ref, signature, .. } = policy {
            let key = self.load_external(&authority_public(authority)?)?;
            let signature = approval_signature(signature)?;
            let result = (|| {
                let (_, key_name, _) = self.ctx.read_public(key).map_err(wrap("TPM2_ReadPublic"))?;
                let a_hash = crate::model::HashAlg::Sha256.digest(&[approved_policy.as_slice(), policy_ref].concat());
                let ticket = self
                    .ctx
                    .execute_without_session(|c| {
                        c.verify_signature(key, Digest::try_from(a_hash.clone())?, signature.clone())
                    })
                    .map_err(wrap("TPM2_VerifySignature"))?;
                let approved = Digest::try_from(approved_policy.clone()).map_err(wrap("approved policy"))?;
                let nonce = tss_esapi::structures::Nonce::try_from(policy_ref.clone()).map_err(wrap("policy ref"))?;
                self.ctx
                    .execute_without_session(|c| c.policy_authorize(policy_session, approved, nonce, &key_name, ticket))
                    .map_err(wrap("TPM2_PolicyAuthorize"))
            })();
            let _ = self.ctx.flush_context(key.into());
            result?;
        }
        Ok(())
    }

    fn flush_session(&mut self, session: AuthSession) {
        let _ = self.ctx.flush_context(ObjectHandle::from(tss_esapi::handles::SessionHandle::from(session)));
    }

    fn evict(&mut self, name: &[u8]) {
        if let Some((handle, _)) = self.loaded.map.remove(name) {
            let _ = self.ctx.flush_context(handle.into());
        }
    }

    /// Loads an external public key into the owner hierarchy, making room in a full TPM (a
    /// 3-slot TPM may hold the SRK and two keys) by evicting loaded keys.
    fn load_external(&mut self, public: &Public) -> Result<KeyHandle, TpmError> {
        loop {
            let loaded = self
                .ctx
                .execute_without_session(|c| c.load_external_public(public.clone(), Hierarchy::Owner))
                .map_err(wrap("TPM2_LoadExternal"));
            match loaded {
                Ok(k) => return Ok(k),
                Err(TpmError::ObjectMemory) if self.out_of_slots() => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The TPM or the resource manager in front of it refused a new transient object (TPM_RC_OBJECT_MEMORY,
    /// or tpm2-abrmd's 0xb0902 when the vault holds its per-client most): it holds no more
    /// than the keys loaded now, so the key budget shrinks to that (a smaller
    /// `max_loaded_objects` than configured, learned once instead of paying a failed command on
    /// every load), and the least recently used key goes to make room. False if no key is
    /// loaded (nothing to make room with).
    fn out_of_slots(&mut self) -> bool {
        let held = self.loaded.map.len();
        if held == 0 {
            return false;
        }
        if held < self.max_keys {
            tracing::info!(
                keys = held,
                configured = self.max_keys,
                "the TPM's resource manager holds no more objects: keeping at most this many keys loaded"
            );
            self.max_keys = held;
            self.learned_max_keys = Some(held);
        }
        self.evict_oldest()
    }

    /// Flushes the least recently used key. False if none is loaded.
    fn evict_oldest(&mut self) -> bool {
        match self.loaded.pop_oldest() {
            Some(old) => {
                let _ = self.ctx.flush_context(old.into());
                true
            }
            None => false,
        }
    }

    fn hmac_session(&mut self) -> Result<AuthSession, TpmError> {
        if let Some(s) = self.hmac {
            return Ok(s);
        }
        let session = self
            .ctx
            .start_auth_session(
                Some(self.srk),
                None,
                None,
                SessionType::Hmac,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            )
            .map_err(wrap("TPM2_StartAuthSession"))?
            .ok_or_else(|| TpmError::Malformed("no session handle".into()))?;
        let (attrs, mask) =
            SessionAttributesBuilder::new().with_decrypt(true).with_encrypt(true).with_continue_session(true).build();
        self.ctx.tr_sess_set_attributes(session, attrs, mask).map_err(wrap("Esys_TRSess_SetAttributes"))?;
        self.hmac = Some(session);
        Ok(session)
    }

    /// Forgets the HMAC session after a failure that may have closed it, so the next use
    /// starts a fresh one.
    fn check_session<T>(&mut self, r: Result<T, TpmError>) -> Result<T, TpmError> {
        if r.is_err() {
            self.forget_hmac_session();
        }
        r
    }

    /// Flushes the HMAC session; the next command that needs one starts a fresh one.
    fn forget_hmac_session(&mut self) {
        if let Some(s) = self.hmac.take() {
            self.flush_session(s);
        }
    }
}

/// Why a `device:` TCTI may have failed to open: the device exists but this process may not
/// read and write it (`/dev/tpmrm0` is `0660 root:tss` with Debian's and Ubuntu's udev rules,
/// `0600 root` without them). Empty for other TCTIs and when access is not the problem.
fn device_access_hint(tcti: &str) -> String {
    use nix::unistd::{access, AccessFlags};
    use std::os::unix::fs::MetadataExt;
    let Some(path) = tcti.strip_prefix("device:").filter(|p| !p.is_empty()) else {
        return String::new();
    };
    let Ok(meta) = std::fs::metadata(path) else {
        return String::new();
    };
    if access(path, AccessFlags::R_OK | AccessFlags::W_OK).is_ok() {
        return String::new();
    }
    format!(
        " ({path} is mode {:o}, uid {} gid {}, and this process (uid {}, gid {}) may not read and write it: \
         run the daemon in the group that owns the device, `tss` on Debian and Ubuntu (the shipped unit's \
         SupplementaryGroups=tss), and give the device to that group (the `tpm-udev` package's rule: \
         KERNEL==\"tpmrm[0-9]*\", GROUP=\"tss\", MODE=\"0660\"))",
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
        nix::unistd::geteuid(),
        nix::unistd::getegid(),
    )
}

/// Drops a connection whose transport is dead. Context's destructor tries to flush handles it
/// tracks; with the link gone those calls fail fast and are ignored.
fn drop_quietly(conn: Conn) {
    drop(conn);
}

/// Flushes transient objects and sessions left in the TPM by an earlier owner that died without
/// cleaning up (a crashed daemon on a TPM without a resource manager, such as swtpm or
/// /dev/tpm0, leaves them occupying the few object slots). The vault is the TPM's only user on
/// such devices. Behind a resource manager (`sessions` false) only transient objects: the list
/// shows this connection's own (none yet), but session handles are not virtualised, so it
/// would list, and this would flush, other processes' saved sessions.
fn flush_leftovers(ctx: &mut Context, sessions: bool) {
    const HANDLE_RANGES: [u32; 3] = [TRANSIENT_FIRST, 0x0200_0000, 0x0300_0000];
    let ranges = if sessions { &HANDLE_RANGES[..] } else { &HANDLE_RANGES[..1] };
    let mut flushed = 0;
    for &first in ranges {
        let Ok((CapabilityData::Handles(list), _)) = ctx.get_capability(CapabilityType::Handles, first, 64) else {
            continue;
        };
        for handle in list.iter() {
            let raw = u32::from(*handle);
            if raw >> 24 != first >> 24 {
                continue;
            }
            let Ok(tpm_handle) = RawTpmHandle::try_from(raw) else { continue };
            if let Ok(obj) = ctx.execute_without_session(|c| c.tr_from_tpm_public(tpm_handle)) {
                if ctx.flush_context(obj).is_ok() {
                    flushed += 1;
                }
            }
        }
    }
    if flushed > 0 {
        tracing::warn!(flushed, "flushed TPM objects/sessions left by an earlier process");
    }
}

/// A signature the vault asks of the TPM: everything [`Tpm::sign`] needs, in the vault's own
/// types, so it can wait in the actor's queue.
pub struct SignJob {
    /// The key.
    pub key: KeyBlob,
    /// Its algorithm (how the signature is encoded).
    pub alg: KeyAlg,
    pub scheme: Scheme,
    /// Hash the digest was made with.
    pub hash: HashAlg,
    /// The digest to sign.
    pub digest: Vec<u8>,
    /// The key's password, if it has one.
    pub auth: Option<zeroize::Zeroizing<Vec<u8>>>,
    /// The policy to satisfy, for a PCR-bound key.
    pub policy: Option<PolicyAuth>,
}

impl std::fmt::Debug for SignJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignJob").field("key", &self.key).field("scheme", &self.scheme).finish_non_exhaustive()
    }
}

/// The TPM public area of an external ECC P-256 key (a policy authority).
fn authority_public(key: &p256::PublicKey) -> Result<Public, TpmError> {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    let point = key.to_encoded_point(false);
    let (Some(x), Some(y)) = (point.x(), point.y()) else {
        return Err(TpmError::Malformed("policy authority key is the identity point".into()));
    };
    templates::external_p256(x, y)
}

/// An approval's ECDSA P-256 / SHA-256 signature as `TPM2_VerifySignature` takes it.
fn approval_signature(sig: &p256::ecdsa::Signature) -> Result<Signature, TpmError> {
    let (r, s) = sig.split_bytes();
    let ecc = tss_esapi::structures::EccSignature::create(
        HashingAlgorithm::Sha256,
        tss_esapi::structures::EccParameter::try_from(r.to_vec()).map_err(wrap("signature r"))?,
        tss_esapi::structures::EccParameter::try_from(s.to_vec()).map_err(wrap("signature s"))?,
    )
    .map_err(wrap("signature"))?;
    Ok(Signature::EcDsa(ecc))
}
