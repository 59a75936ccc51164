//! The vault: key operations built from the store and the TPM actor. This is the library API
//! that the gRPC services (and the in-process rustls signer, and tests) call.
//!
//! It validates nothing that `model` types already guarantee, hashes messages in-core, keeps a
//! parsed copy of hot key records, and never touches the TPM from an async worker: every TPM
//! operation is a job for the actor, every file operation runs on the blocking pool.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zeroize::Zeroizing;

pub mod attest;
mod cache;
pub mod cert;
pub mod datakey;
pub mod lockout;
pub mod pq;
pub mod seal;

pub use cert::{CertSubject, StoredChain};
pub use lockout::{Client, LockoutConfig, Password};
pub use seal::SealTarget;

use crate::auth::Denied;
use crate::crypto::verify;
use crate::error::Error;
use crate::model::{HashAlg, KeyAlg, KeyName, Owner, PcrTarget, Scheme, SignInput, Usage, Usages};
use crate::store::{KeyRecord, OwnerCheck, Record as _, SealPolicy, Store, StoreError};
use crate::tpm::{
    convert, ClientKey, ConnectionConfig, KeyBlob, PolicyAuth, QueueConfig, ResourceManager, SignJob, TpmError,
    TpmHandle, TpmInfo,
};

/// Key generation can take seconds on a TPM (RSA-3072 especially).
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
/// Parsed records kept in memory.
const CACHE_MAX: usize = 4096;
/// Longest key password the TPM accepts for a SHA-256 name algorithm.
const MAX_AUTH: usize = 32;
/// Longest auth value a TPM2B_AUTH holds (a longer password cannot be the key's).
const MAX_AUTH_VALUE: usize = 64;

/// How to open a vault.
#[derive(Debug, Clone)]
pub struct VaultConfig {
    /// State directory.
    pub state_dir: PathBuf,
    /// TCTI string.
    pub tcti: String,
    /// Most transient objects kept loaded, SRK included (without a resource manager).
    pub max_loaded_objects: usize,
    /// The resource manager in front of the TPM; `None`: detected from the TCTI string
    /// ([`ResourceManager::detect`]).
    pub resource_manager: Option<ResourceManager>,
    /// Actor queue and deadlines.
    pub queue: QueueConfig,
    /// True when the TPM is the daemon's own swtpm (reported in status).
    pub simulator: bool,
    /// How long an unsealed data key stays in memory after its last use.
    pub datakey_idle: Duration,
    /// The dictionary-attack guard's settings (config keys `da_*`).
    pub lockout: LockoutConfig,
}

impl VaultConfig {
    /// A vault in `state_dir` over the TPM at `tcti`, with the daemon's defaults for the rest:
    /// 3 loaded objects, the default queue, no simulator, data keys kept 300 s after their last
    /// use, the default dictionary-attack guard.
    pub fn new(state_dir: impl Into<PathBuf>, tcti: impl Into<String>) -> Self {
        Self {
            state_dir: state_dir.into(),
            tcti: tcti.into(),
            max_loaded_objects: 3,
            resource_manager: None,
            queue: QueueConfig::default(),
            simulator: false,
            datakey_idle: Duration::from_secs(300),
            lockout: LockoutConfig::default(),
        }
    }
}

/// The three kinds of named record a vault keeps, each a namespace of its own: the same name
/// can be a signing key, a sealed secret and a data key, with different owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// A signing (or ML-KEM) key: key, certificate and policy-signing RPCs.
    Key,
    /// A sealed secret: Seal, Unseal, DeleteSealed.
    Sealed,
    /// A data key: CreateDataKey, DeleteDataKey, Encrypt, Decrypt.
    DataKey,
}

/// A key as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub name: KeyName,
    pub alg: KeyAlg,
    /// TPM object name.
    pub tpm_name: Vec<u8>,
    /// Creation time, Unix seconds.
    pub created_unix: i64,
    /// Creating client's uid ([`Owner::CERTIFICATE_UID`] for a TLS client).
    pub owner_uid: u32,
    /// Creating client: uid or certificate identity.
    pub owner: Owner,
    /// Password-protected.
    pub has_auth: bool,
    /// PCR binding, if any.
    pub pcr_policy: Option<crate::store::PcrPolicy>,
    /// What the key may be used for.
    pub usages: Usages,
}

impl From<&KeyRecord> for KeyInfo {
    fn from(r: &KeyRecord) -> Self {
        Self {
            name: r.name.clone(),
            alg: r.alg,
            tpm_name: r.object.tpm_name.clone(),
            created_unix: r.created_unix,
            owner_uid: r.owner_uid,
            owner: r.owner(),
            has_auth: r.has_auth,
            pcr_policy: r.pcr_policy.clone(),
            usages: r.usages(),
        }
    }
}

/// What [`Vault::list_visible`] asks its filter about: a key's name, and its owner once the
/// record has been read.
#[derive(Debug, Clone, Copy)]
pub struct Visibility<'a> {
    /// The key's name.
    pub name: &'a KeyName,
    /// Its creator; `None` while only the name is known.
    pub owner: Option<&'a Owner>,
}

/// A page of [`Vault::list_visible`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    /// The keys, in name order.
    pub keys: Vec<KeyInfo>,
    /// Where the next page starts (after this name), if there may be more.
    pub next: Option<KeyName>,
}

/// A finished signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignOutput {
    /// DER ECDSA-Sig-Value, RSA signature bytes, ML-DSA signature or hybrid signature.
    pub signature: Vec<u8>,
    /// Scheme used.
    pub scheme: Scheme,
    /// Hash used; `None` for ML-DSA (which hashes internally with SHAKE256).
    pub hash: Option<HashAlg>,
}

/// What to sign and how.
#[derive(Debug, Clone)]
pub struct SignRequest {
    /// Message or digest.
    pub input: SignInput,
    /// Hash; `None` = the key's default.
    pub hash: Option<HashAlg>,
    /// Scheme; `None` = the key's default.
    pub scheme: Option<Scheme>,
}

/// What a finished TPM signature is checked against (the first RSA-PSS signature of a TPM).
struct SignJobDone {
    scheme: Scheme,
    hash: HashAlg,
    digest: Vec<u8>,
}

/// A record parsed into what the TPM needs, plus the public key, cached per name.
pub(crate) struct Loaded {
    record: KeyRecord,
    /// The record's TPM object: the key (ECC, RSA, a hybrid's ECDSA half) or, for ML-DSA and
    /// ML-KEM keys, the sealed wrapping key.
    blob: KeyBlob,
    /// The key's SubjectPublicKeyInfo (a hybrid key's: its ECDSA half's).
    spki: Vec<u8>,
    /// The sealed object holding the wrapping key of the post-quantum material, if any.
    wrap: Option<KeyBlob>,
    /// A hybrid key's ML-DSA-65 SubjectPublicKeyInfo.
    pq_spki: Option<Vec<u8>>,
}

/// Whether this TPM's RSA-PSS salt length has been checked.
const PSS_UNKNOWN: u8 = 0;
const PSS_OK: u8 = 1;
const PSS_BAD: u8 = 2;

pub(crate) struct Inner {
    tpm: TpmHandle,
    datakeys: datakey::KeyCache,
    pqkeys: pq::PqCache,
    drbg: crate::crypto::drbg::Drbg,
    /// The key of the opaque page tokens ([`Vault::page_token`]).
    page_key: crate::crypto::token::TokenKey,
    store: Store,
    cache: Mutex<cache::RecordCache<Loaded>>,
    /// The attestation keys' parsed records (ECC, RSA), once read or created.
    ak: Mutex<[Option<Arc<Loaded>>; 2]>,
    pss: AtomicU8,
    /// Serialises certificate replacement with itself and with key deletion.
    cert_lock: tokio::sync::Mutex<()>,
    /// The dictionary-attack guard every password attempt passes.
    lockout: lockout::Throttle,
    tcti: String,
    /// The resource manager in front of the TPM (for `status`).
    resource_manager: ResourceManager,
    simulator: bool,
    started: Instant,
}

/// The key vault. Cheap to clone.
#[derive(Clone)]
pub struct Vault {
    inner: Arc<Inner>,
    /// Whose TPM jobs this handle's operations are: every TPM call names it
    /// ([`crate::tpm::queue`]). [`ClientKey::DAEMON`] for the vault [`Vault::open`] returns;
    /// the RPC layer works through [`Vault::for_client`] with the caller's key.
    client: ClientKey,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault").field("tcti", &self.inner.tcti).finish_non_exhaustive()
    }
}

impl Vault {
    /// Opens the state directory, connects to the TPM and checks (or, on first start, records)
    /// the SRK name.
    ///
    /// # Errors
    /// [`Error::Store`] for state-dir problems; [`Error::Tpm`] when the TPM is unreachable or
    /// not the one the state belongs to.
    pub async fn open(cfg: VaultConfig) -> Result<Self, Error> {
        let dir = cfg.state_dir.clone();
        let store = blocking(move || Store::open(dir)).await?;
        let s = store.clone();
        let expected = blocking(move || s.srk_name()).await?;
        let resource_manager = cfg.resource_manager.unwrap_or_else(|| ResourceManager::detect(&cfg.tcti));
        let connection = ConnectionConfig {
            tcti: cfg.tcti.clone(),
            resource_manager,
            max_loaded: cfg.max_loaded_objects.max(2),
            expected_srk_name: expected.clone(),
        };
        let (tpm, info) = TpmHandle::open(connection, cfg.queue.clone()).await?;
        if expected.is_none() {
            let s = store.clone();
            let name = info.srk_name.clone();
            blocking(move || s.set_srk_name(&name)).await?;
            tracing::info!(srk = %hex::encode(&info.srk_name), "recorded the SRK name of this TPM");
        }
        let drbg = datakey::seeded_drbg(&tpm).await?;
        let page_key = crate::crypto::token::TokenKey::new(&drbg)?;
        let vault = Self {
            client: ClientKey::DAEMON,
            inner: Arc::new(Inner {
                tpm,
                datakeys: datakey::KeyCache::default(),
                pqkeys: pq::PqCache::default(),
                drbg,
                page_key,
                store,
                cache: Mutex::new(cache::RecordCache::new(CACHE_MAX)),
                ak: Mutex::new([None, None]),
                pss: AtomicU8::new(PSS_UNKNOWN),
                cert_lock: tokio::sync::Mutex::new(()),
                lockout: lockout::Throttle::new(cfg.lockout),
                tcti: cfg.tcti,
                resource_manager,
                simulator: cfg.simulator,
                started: Instant::now(),
            }),
        };
        datakey::spawn_maintenance(Arc::downgrade(&vault.inner), cfg.datakey_idle);
        Ok(vault)
    }

    /// The same vault, its TPM jobs queued as `client`'s (the RPC layer's handle for one call).
    #[must_use]
    pub fn for_client(&self, client: ClientKey) -> Self {
        Self { inner: self.inner.clone(), client }
    }

    /// The TPM actor handle (for status, metrics and in-process signing).
    pub fn tpm(&self) -> &TpmHandle {
        &self.inner.tpm
    }

    /// The dictionary-attack guard (its counters, for the metrics).
    pub fn lockout(&self) -> &lockout::Throttle {
        &self.inner.lockout
    }

    /// The TCTI in use.
    pub fn tcti(&self) -> &str {
        &self.inner.tcti
    }

    /// The resource manager in front of the TPM, as configured or detected.
    pub fn resource_manager(&self) -> ResourceManager {
        self.inner.resource_manager
    }

    /// Whether the TPM is the daemon's own simulator.
    pub fn is_simulator(&self) -> bool {
        self.inner.simulator
    }

    /// Why the TPM is taken for a software TPM (`--simulator`, a software TPM's TCTI, or its
    /// reported identity); `None` when it looks like hardware.
    pub fn software_tpm(&self) -> Option<crate::tpm::SoftwareTpm> {
        crate::tpm::software::detect(self.inner.simulator, &self.inner.tcti, &self.tpm_info())
    }

    /// Time since the vault was opened.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// The creator (uid or certificate identity) recorded for the signing key, sealed secret or
    /// data key `name` (three separate namespaces, chosen by `kind`); `None` if there is no
    /// such record. Owner-only access rules compare the caller with it.
    ///
    /// # Errors
    /// Store errors (a record that cannot be read is not taken as absent).
    pub async fn owner(&self, name: &KeyName, kind: Resource) -> Result<Option<Owner>, Error> {
        if kind == Resource::Key {
            if let Some(l) = self.cached(name) {
                return Ok(Some(l.record.owner()));
            }
        }
        let store = self.inner.store.clone();
        let n = name.clone();
        blocking(move || match kind {
            Resource::Key => store.keys().get(&n).map(|r| r.map(|r| r.owner())),
            Resource::Sealed => store.sealed().get(&n).map(|r| r.map(|r| r.owner())),
            Resource::DataKey => store.datakeys().get(&n).map(|r| r.map(|r| r.owner())),
        })
        .await
    }

    /// TPM facts from the last connect.
    pub fn tpm_info(&self) -> TpmInfo {
        self.inner.tpm.shared().info()
    }

    /// Creates a key inside the TPM and stores its wrapped blobs. ML-DSA and ML-KEM keys are
    /// generated in-core and sealed by the TPM instead; a hybrid key is both (see [`pq`]).
    ///
    /// # Errors
    /// [`Error::KeyExists`], [`Error::InvalidArgument`] (password too long, or a password on a
    /// post-quantum key), TPM and store errors. Nothing is stored unless the TPM created the key.
    pub async fn create_key(
        &self,
        name: KeyName,
        alg: KeyAlg,
        owner: impl Into<Owner>,
        auth: Option<Zeroizing<Vec<u8>>>,
        pcr: Option<PcrTarget>,
    ) -> Result<KeyInfo, Error> {
        self.create_key_with_usages(name, alg, owner, auth, pcr, Usages::DEFAULT).await
    }

    /// [`Vault::create_key`] for a key that may be used for `usages` ([`Vault::create_key`]'s
    /// keys: raw signatures only, [`Usages::DEFAULT`]).
    ///
    /// # Errors
    /// As [`Vault::create_key`]; [`Error::InvalidArgument`] for a usage the algorithm cannot
    /// serve (`ssh` needs an ECC or RSA key, `policy` an ecc-p256 key).
    pub async fn create_key_with_usages(
        &self,
        name: KeyName,
        alg: KeyAlg,
        owner: impl Into<Owner>,
        auth: Option<Zeroizing<Vec<u8>>>,
        pcr: Option<PcrTarget>,
        usages: Usages,
    ) -> Result<KeyInfo, Error> {
        check_usages_suit(alg, usages)?;
        let (owner_uid, owner_certificate) = owner.into().to_fields();
        if let Some(a) = &auth {
            if a.len() > MAX_AUTH {
                return Err(Error::invalid(format!("key password longer than {MAX_AUTH} bytes")));
            }
            if pcr.is_some() && !a.is_empty() {
                return Err(Error::invalid("a key is either PCR-bound or password-protected, not both"));
            }
            if alg.has_pq() && !a.is_empty() {
                return Err(Error::invalid(format!(
                    "{alg} keys cannot have a password (their TPM part is a sealed object); bind them to PCRs instead"
                )));
            }
        }
        if self.load(&name).await.is_ok() {
            return Err(Error::KeyExists(name.clone()));
        }
        let pcr_policy = match pcr {
            Some(t) => Some(self.pcr_policy(&t.selection, t.values).await?),
            None => None,
        };
        let auth_policy = seal::auth_policy(pcr_policy.as_ref())?;
        let tpm_auth = auth.filter(|a| !a.is_empty());
        let has_auth = tpm_auth.is_some();
        let (object, pq) = match alg.tpm_key() {
            // ML-DSA / ML-KEM: the record's TPM object is the sealed wrapping key.
            None => {
                let (section, sealed) = self.seal_pq(&name, alg, pcr_policy.as_ref()).await?;
                (sealed, Some(section))
            }
            Some(_) => {
                let object = self
                    .inner
                    .tpm
                    .call_with_timeout(self.client, "create", CREATE_TIMEOUT, move |tpm| {
                        tpm.create_key(alg, auth_policy.as_deref(), tpm_auth.as_deref().map(Vec::as_slice))
                    })
                    .await?;
                // A hybrid key's ML-DSA-65 half, sealed under the same PCR policy.
                let pq = if alg.has_pq() {
                    let (mut section, sealed) = self.seal_pq(&name, alg, pcr_policy.as_ref()).await?;
                    section.wrapping_key = Some(sealed);
                    Some(section)
                } else {
                    None
                };
                (object, pq)
            }
        };
        let record = KeyRecord {
            version: crate::store::record::RECORD_VERSION,
            name: name.clone(),
            alg,
            created_unix: unix_now(),
            owner_uid,
            owner_certificate,
            object,
            has_auth,
            pcr_policy,
            cert_chain_pem: None,
            cert_version: 0,
            pq,
            usages: Some(usages),
        };
        let info = KeyInfo::from(&record);
        let store = self.inner.store.clone();
        blocking(move || store.keys().insert(&record)).await?;
        tracing::info!(key = %name, alg = %alg, "key created");
        Ok(info)
    }

    /// A key's metadata.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn key(&self, name: &KeyName) -> Result<KeyInfo, Error> {
        Ok(KeyInfo::from(&self.load(name).await?.record))
    }

    /// Keys in name order after `after`, at most `limit` (records that do not parse are
    /// skipped, as in [`Vault::list_visible`]).
    ///
    /// # Errors
    /// Store errors.
    pub async fn list(&self, after: Option<KeyName>, limit: usize) -> Result<Vec<KeyInfo>, Error> {
        Ok(self.list_visible(after, limit, limit, |_| true).await?.keys)
    }

    /// A page of the keys `visible` accepts, in name order after `after`: at most `limit` of
    /// them, from at most `scan` records read (so one call costs the same whoever asks and
    /// whatever they may see). `next` is set when a further visible key was seen, or when the
    /// scan bound ended the page (which a caller can tell from a short page with a next one:
    /// that at least `scan` records follow, never which). `visible` is asked first with the
    /// name alone (`owner: None`; answering true then means "maybe": the record is read and
    /// asked again with its owner), so records the caller can never see by name are not read
    /// at all. A record that does not parse is skipped, logged and counted
    /// ([`Vault::corrupt_records`]), not fatal.
    ///
    /// # Errors
    /// Store I/O errors.
    pub async fn list_visible(
        &self,
        after: Option<KeyName>,
        limit: usize,
        scan: usize,
        visible: impl Fn(Visibility<'_>) -> bool,
    ) -> Result<KeyPage, Error> {
        let store = self.inner.store.clone();
        let names = blocking(move || store.keys().list(after.as_ref(), scan)).await?;
        let more_in_store = names.len() >= scan;
        let mut keys = Vec::new();
        for name in &names {
            if !visible(Visibility { name, owner: None }) {
                continue;
            }
            let loaded = match self.load(name).await {
                Ok(l) => l,
                // Deleted between listing and reading: skip it.
                Err(Error::KeyNotFound(_)) => continue,
                Err(e @ Error::Store(StoreError::Io { .. })) => return Err(e),
                Err(e) => {
                    tracing::warn!(key = %name, error = %e, "skipping a key record that does not parse");
                    self.inner.store.count_corrupt();
                    continue;
                }
            };
            let owner = loaded.record.owner();
            if !visible(Visibility { name, owner: Some(&owner) }) {
                continue;
            }
            if keys.len() >= limit {
                // Another visible key: more follow. (Only a visible one says so, so a page's
                // end never tells whether hidden keys come after it.)
                let next = keys.last().map(|k: &KeyInfo| k.name.clone());
                return Ok(KeyPage { keys, next });
            }
            keys.push(KeyInfo::from(&loaded.record));
        }
        // The scan bound ended the page: the next one starts after the last record read.
        let next = if more_in_store { names.last().cloned() } else { None };
        Ok(KeyPage { keys, next })
    }

    /// The opaque page token of a listing by `caller` (any string naming the caller) that
    /// continues after `position` (see [`crate::crypto::token`]): the caller can neither read
    /// the position (it may be a key it may not see) nor choose one.
    ///
    /// # Errors
    /// [`Error::Internal`] if the DRBG fails.
    pub fn page_token(&self, caller: &str, position: &KeyName) -> Result<String, Error> {
        self.inner.page_key.seal(&self.inner.drbg, &page_binding(caller), position.as_str().as_bytes())
    }

    /// The position a page token from [`Vault::page_token`] for `caller` carries.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other string.
    pub fn page_position(&self, caller: &str, token: &str) -> Result<KeyName, Error> {
        let invalid = || {
            Error::invalid("page_token is not one this daemon issued to this client (tokens do not survive a restart)")
        };
        let plain = self.inner.page_key.open(&page_binding(caller), token).ok_or_else(invalid)?;
        let name = std::str::from_utf8(&plain).map_err(|_| invalid())?;
        KeyName::try_from(name).map_err(|_| invalid())
    }

    /// Records a listing skipped because they do not parse, since the daemon started.
    pub fn corrupt_records(&self) -> u64 {
        self.inner.store.corrupt_records()
    }

    /// Number of stored keys.
    ///
    /// # Errors
    /// Store errors.
    pub async fn key_count(&self) -> Result<usize, Error> {
        let store = self.inner.store.clone();
        blocking(move || store.keys().count()).await
    }

    /// Deletes a key for good (the TPM holds no copy once its object is flushed).
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn delete(&self, name: &KeyName) -> Result<(), Error> {
        self.delete_checked(name, OwnerCheck::any()).await
    }

    /// [`Vault::delete`] when `check` allows it for the key's owner, checked under the store's
    /// write lock (see [`crate::store::Table::remove_checked`]).
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::PermissionDenied`] when the check refuses; store errors.
    pub async fn delete_checked(&self, name: &KeyName, check: OwnerCheck) -> Result<(), Error> {
        let _guard = self.inner.cert_lock.lock().await;
        let cached = self.cache_remove(name);
        self.inner.pqkeys.remove(name);
        let store = self.inner.store.clone();
        let n = name.clone();
        let existed = blocking(move || store.keys().remove_checked(&n, &check)).await?;
        self.inner.lockout.forget(name);
        // A load that read the record before the removal must not cache it now.
        if let Ok(mut cache) = self.inner.cache.lock() {
            cache.remove_deleted(name);
        }
        if let Some(l) = cached {
            let mut names = vec![l.blob.name.clone()];
            names.extend(l.wrap.as_ref().map(|w| w.name.clone()));
            // Best effort: an unreachable TPM has no loaded copy to flush anyway.
            let _ = self
                .inner
                .tpm
                .call(self.client, "evict", move |tpm| {
                    for tpm_name in &names {
                        tpm.evict(tpm_name);
                    }
                    Ok(())
                })
                .await;
        }
        if existed {
            tracing::info!(key = %name, "key deleted");
            Ok(())
        } else {
            Err(Error::not_found(name))
        }
    }

    /// The key's public part as DER SubjectPublicKeyInfo.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn public_key(&self, name: &KeyName) -> Result<(KeyAlg, Vec<u8>), Error> {
        let l = self.load(name).await?;
        Ok((l.record.alg, l.spki.clone()))
    }

    /// Signs with a TPM-resident key. Messages are hashed here, in-core; the TPM signs the
    /// digest. ML-DSA and hybrid keys sign whole messages (see [`pq`]). A password attempt
    /// passes the dictionary-attack guard first ([`lockout`]): the client's and the key's
    /// budgets of wrong passwords, then, in the same TPM job as the signature, the TPM's reserve.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::InvalidArgument`] for a scheme the key cannot use, a
    /// wrong digest length, a digest for an ML-DSA or hybrid key, or a missing password;
    /// [`Error::Throttled`] and [`TpmError::DaReserve`] from the guard; [`Error::PcrMismatch`];
    /// TPM errors.
    pub async fn sign(&self, name: &KeyName, req: SignRequest, auth: Option<Password>) -> Result<SignOutput, Error> {
        self.sign_as(name, req, auth, Usage::Sign).await
    }

    /// An SSH signature: `req`'s input must be a message that parses as an SSH
    /// user-authentication request naming this key or an SSHSIG blob
    /// ([`crate::crypto::ssh`]); the key needs the `ssh` usage. The scheme and hash are what
    /// SSH needs for the key and the request (a request's own must agree); the message is
    /// hashed here.
    ///
    /// # Errors
    /// As [`Vault::sign`]; [`Error::PermissionDenied`] for a key without the `ssh` usage,
    /// [`Error::InvalidArgument`] for a digest or a message that is not SSH's.
    pub async fn sign_ssh(
        &self,
        name: &KeyName,
        req: SignRequest,
        auth: Option<Password>,
    ) -> Result<SignOutput, Error> {
        let loaded = self.load(name).await?;
        check_usage(&loaded.record, Usage::Ssh)?;
        let SignInput::Message(message) = &req.input else {
            return Err(Error::invalid("an SSH signature takes the whole message, not a digest"));
        };
        if message.len() > SignInput::MAX_MESSAGE {
            return Err(Error::invalid(format!("message larger than {} bytes", SignInput::MAX_MESSAGE)));
        }
        let not_ssh = |e: crate::crypto::ssh::SshDataError| Error::invalid(format!("not SSH signing data: {e}"));
        let signed = crate::crypto::ssh::parse(message).map_err(not_ssh)?;
        let blob = crate::crypto::ssh::public_key_blob(loaded.record.alg, &loaded.spki)
            .ok_or_else(|| Error::invalid(format!("{} keys cannot make SSH signatures", loaded.record.alg)))?;
        let (scheme, hash) = crate::crypto::ssh::signing_plan(loaded.record.alg, &blob, &signed, req.scheme, req.hash)
            .map_err(not_ssh)?;
        // Hashed here, so that SHA-1 (`ssh-rsa`) passes as the digest it is for PKCS#1 v1.5.
        let input = SignInput::Digest(hash.digest(message));
        self.sign_loaded(&loaded, SignRequest { input, hash: Some(hash), scheme: Some(scheme) }, auth).await
    }

    /// [`Vault::sign`] for a request that needs `usage` of the key.
    pub(crate) async fn sign_as(
        &self,
        name: &KeyName,
        req: SignRequest,
        auth: Option<Password>,
        usage: Usage,
    ) -> Result<SignOutput, Error> {
        let loaded = self.load(name).await?;
        check_usage(&loaded.record, usage)?;
        self.sign_loaded(&loaded, req, auth).await
    }

    /// Signs with a key whose usages were checked.
    async fn sign_loaded(
        &self,
        loaded: &Arc<Loaded>,
        req: SignRequest,
        auth: Option<Password>,
    ) -> Result<SignOutput, Error> {
        let name = &loaded.record.name;
        if loaded.record.alg.has_pq() {
            return self.sign_pq(loaded, req).await;
        }
        let (job, digest, client) = self.prepare_sign(loaded, req, auth)?;
        let done = SignJobDone { scheme: job.scheme, hash: job.hash, digest };
        // Only password keys count failures: the TPM has nothing to guess on the others.
        let attempt = match &client {
            Some(c) => Some(self.inner.lockout.admit(name, c).await?),
            None => None,
        };
        let reserve = if attempt.is_some() { self.inner.lockout.config().tpm_reserve } else { 0 };
        let result = self
            .inner
            .tpm
            .call(self.client, "sign", move |tpm| {
                tpm.check_da_reserve(reserve)?;
                tpm.sign(&job)
            })
            .await;
        if let Some(attempt) = attempt {
            if matches!(result, Err(TpmError::DaReserve { .. })) {
                self.inner.lockout.count_refused();
            }
            attempt.settle(lockout::Outcome::of(&result));
        }
        let sig = match result {
            Err(TpmError::PolicyFailed) => {
                let policy = loaded.record.pcr_policy.clone().map(|pcr| SealPolicy::Pcr { pcr });
                return Err(match policy {
                    Some(p) => self.pcr_mismatch_error(&p, TpmError::PolicyFailed).await,
                    None => TpmError::PolicyFailed.into(),
                });
            }
            other => other?,
        };
        self.finish_sign(loaded, done, sig)
    }

    /// Narrows a key's usages to `usages`, which must be a subset of the key's current ones
    /// (usages are never widened).
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::InvalidArgument`] for a usage the key does not have;
    /// store errors.
    pub async fn set_usages(&self, name: &KeyName, usages: Usages) -> Result<KeyInfo, Error> {
        // Serialised with certificate replacement and deletion, which rewrite the same record.
        let _guard = self.inner.cert_lock.lock().await;
        let loaded = self.load(name).await?;
        let mut record = loaded.record.clone();
        if !usages.is_subset_of(record.usages()) {
            return Err(Error::invalid(format!(
                "key {name} has usages {}: usages can only be narrowed, not widened to {usages}",
                record.usages()
            )));
        }
        record.usages = Some(usages);
        // Under `cert_lock`, so a delete cannot slip in between the read and the write.
        self.replace_record(name, &record).await?;
        let info = KeyInfo::from(&record);
        let fresh = Arc::new(Loaded {
            record,
            blob: loaded.blob.clone(),
            spki: loaded.spki.clone(),
            wrap: loaded.wrap.clone(),
            pq_spki: loaded.pq_spki.clone(),
        });
        if let Ok(mut cache) = self.inner.cache.lock() {
            cache.insert(name.clone(), fresh);
        }
        tracing::info!(key = %name, usages = %usages, "key usages narrowed");
        Ok(info)
    }

    /// [`Vault::sign`] for synchronous callers (rustls' `Signer::sign`): blocks the calling
    /// thread, never an async worker's event loop (wrap in `block_in_place` on a runtime).
    ///
    /// # Errors
    /// As [`Vault::sign`]; the key must already be cached (see [`Vault::public_key`]).
    pub fn sign_blocking(&self, name: &KeyName, req: SignRequest) -> Result<SignOutput, Error> {
        let loaded = self.cached(name).ok_or_else(|| Error::not_found(name))?;
        check_usage(&loaded.record, Usage::Sign)?;
        if loaded.record.alg.has_pq() {
            return Err(Error::invalid(format!("{} keys cannot sign TLS handshakes", loaded.record.alg)));
        }
        // No password here, so nothing for the dictionary-attack guard to count.
        let (job, digest, _) = self.prepare_sign(&loaded, req, None)?;
        let done = SignJobDone { scheme: job.scheme, hash: job.hash, digest };
        let sig = self.inner.tpm.call_blocking(self.client, "sign", move |tpm| tpm.sign(&job))?;
        self.finish_sign(&loaded, done, sig)
    }

    /// The TPM job of a signature, what [`Vault::finish_sign`] needs of the request, and the
    /// client whose password the job tries (none for a key without a password).
    fn prepare_sign(
        &self,
        loaded: &Arc<Loaded>,
        req: SignRequest,
        auth: Option<Password>,
    ) -> Result<(SignJob, Vec<u8>, Option<Client>), Error> {
        let alg = loaded.record.alg;
        let scheme = req.scheme.unwrap_or_else(|| alg.default_scheme());
        let hash = req.hash.unwrap_or_else(|| alg.default_hash());
        alg.check_scheme(scheme)?;
        hash.check_use(scheme, matches!(req.input, SignInput::Digest(_)))?;
        if scheme == Scheme::RsaPss && self.inner.pss.load(Ordering::Relaxed) == PSS_BAD {
            return Err(TpmError::PssSaltUnsupported.into());
        }
        let (client, auth) = match (loaded.record.has_auth, auth.map(Password::into_parts)) {
            (true, Some((_, a))) if a.len() > MAX_AUTH_VALUE => {
                return Err(Error::invalid("key password too long"));
            }
            (true, Some((client, a))) if !a.is_empty() => (Some(client), Some(a)),
            (true, _) => return Err(Error::from(Denied::NeedsPassword(loaded.record.name.clone()))),
            (false, _) => (None, None),
        };
        let digest = req.input.into_digest(hash)?;
        let job = SignJob {
            key: loaded.blob.clone(),
            alg,
            scheme,
            hash,
            digest: digest.clone(),
            auth,
            policy: loaded.record.pcr_policy.as_ref().map(|p| PolicyAuth::Pcr(p.selection.clone())),
        };
        Ok((job, digest, client))
    }

    /// Checks the first RSA-PSS signature of this TPM (see below) and wraps the signature.
    fn finish_sign(&self, loaded: &Loaded, job: SignJobDone, signature: Vec<u8>) -> Result<SignOutput, Error> {
        let SignJobDone { scheme, hash, digest } = job;
        if scheme == Scheme::RsaPss && self.inner.pss.load(Ordering::Relaxed) != PSS_OK {
            // Some hardware TPMs use the maximum salt length, which TLS 1.3 rejects: check the
            // first PSS signature of this TPM in software and refuse if it is not hash-length.
            let ok = verify::verify_digest(loaded.record.alg, &loaded.spki, scheme, hash, &digest, &signature)?;
            self.inner.pss.store(if ok { PSS_OK } else { PSS_BAD }, Ordering::Relaxed);
            if !ok {
                tracing::error!("TPM RSA-PSS salt length is not the hash length; refusing PSS");
                return Err(TpmError::PssSaltUnsupported.into());
            }
        }
        Ok(SignOutput { signature, scheme, hash: Some(hash) })
    }

    /// Verifies a signature in-core with the key's public part.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], [`Error::InvalidArgument`].
    pub async fn verify(
        &self,
        name: &KeyName,
        input: SignInput,
        signature: &[u8],
        hash: Option<HashAlg>,
        scheme: Option<Scheme>,
    ) -> Result<bool, Error> {
        let l = self.load(name).await?;
        let alg = l.record.alg;
        if alg.has_pq() {
            return self.verify_pq(&l, input, signature, hash, scheme).await;
        }
        let scheme = scheme.unwrap_or_else(|| alg.default_scheme());
        let hash = hash.unwrap_or_else(|| alg.default_hash());
        let digest = input.into_digest(hash)?;
        verify::verify_digest(alg, &l.spki, scheme, hash, &digest, signature)
    }

    /// Makes sure a key's record is parsed and cached (so [`Vault::sign_blocking`] can use it).
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn warm(&self, name: &KeyName) -> Result<(), Error> {
        self.load(name).await.map(|_| ())
    }

    /// Counts transient objects in the TPM (all owners); for status and leak tests.
    ///
    /// # Errors
    /// TPM errors.
    pub async fn transient_handles(&self) -> Result<usize, Error> {
        Ok(self.inner.tpm.call(self.client, "handles", |tpm| tpm.transient_handles()).await?)
    }

    /// Flushes every loaded object (keys, sessions, transient SRK).
    ///
    /// # Errors
    /// When the actor is unreachable.
    pub async fn flush(&self) -> Result<(), Error> {
        self.inner.tpm.flush_all().await?;
        Ok(())
    }

    /// Stops the TPM actor (flushing every loaded object and closing the connection). Later
    /// operations fail with `Unavailable`.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.tpm.shutdown(grace).await;
    }

    /// The state directory.
    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    fn cached(&self, name: &KeyName) -> Option<Arc<Loaded>> {
        self.inner.cache.lock().ok().and_then(|mut c| c.get(name))
    }

    fn cache_remove(&self, name: &KeyName) -> Option<Arc<Loaded>> {
        self.inner.cache.lock().ok().and_then(|mut c| c.remove(name))
    }

    async fn load(&self, name: &KeyName) -> Result<Arc<Loaded>, Error> {
        if let Some(l) = self.cached(name) {
            return Ok(l);
        }
        let seen = self.inner.cache.lock().ok().map(|c| c.deletions());
        let store = self.inner.store.clone();
        let n = name.clone();
        let record = blocking(move || store.keys().get(&n)).await?.ok_or_else(|| Error::not_found(name))?;
        let loaded = Arc::new(parse_record(record)?);
        if let (Some(seen), Ok(mut cache)) = (seen, self.inner.cache.lock()) {
            cache.insert_unless_deleted(name.clone(), loaded.clone(), seen);
        }
        Ok(loaded)
    }
}

pub(crate) fn parse_record(record: KeyRecord) -> Result<Loaded, Error> {
    let corrupt =
        |why: String| Error::Store(StoreError::Corrupt { path: PathBuf::from(record.name.as_str()), reason: why });
    let blob = KeyBlob::try_from(&record.object)?;
    let (spki, wrap, pq_spki) = match (record.alg.tpm_key(), &record.pq) {
        (Some(_), None) => (convert::public_key_der(record.alg, &blob.public)?, None, None),
        // ML-DSA / ML-KEM: the TPM object is the sealed wrapping key.
        (None, Some(pq)) => (crate::crypto::pq::spki_der(record.alg, &pq.public_key)?, Some(blob.clone()), None),
        // Hybrid: the TPM object is the ECDSA half; the wrapping key is in the section.
        (Some(_), Some(pq)) => {
            let w = pq.wrapping_key.as_ref().ok_or_else(|| corrupt("hybrid key without its wrapping key".into()))?;
            let wrap = KeyBlob::try_from(w)?;
            let ml_dsa = crate::crypto::pq::pq_part(record.alg).unwrap_or(KeyAlg::MlDsa65);
            let pq_spki = crate::crypto::pq::spki_der(ml_dsa, &pq.public_key)?;
            (convert::public_key_der(record.alg, &blob.public)?, Some(wrap), Some(pq_spki))
        }
        (None, None) => return Err(corrupt(format!("a {} key without its post-quantum section", record.alg))),
    };
    Ok(Loaded { record, blob, spki, wrap, pq_spki })
}

/// Refuses a request that needs `usage` of a key without it.
fn check_usage(record: &KeyRecord, usage: Usage) -> Result<(), Error> {
    if record.usages().contains(usage) {
        Ok(())
    } else {
        Err(Denied::Usage { key: record.name.clone(), has: record.usages(), needs: usage }.into())
    }
}

/// Refuses usages a key of `alg` cannot serve.
fn check_usages_suit(alg: KeyAlg, usages: Usages) -> Result<(), Error> {
    if usages.contains(Usage::Ssh) && alg.info().ssh_key_type.is_none() {
        return Err(Error::invalid(format!("usage ssh needs an ECC or RSA key, not {alg}")));
    }
    if usages.contains(Usage::Policy) && alg != KeyAlg::EccP256 {
        return Err(Error::invalid(format!("usage policy needs an ecc-p256 key, not {alg}")));
    }
    Ok(())
}

/// The associated data of a page token: its purpose and the caller it was issued to.
fn page_binding(caller: &str) -> Vec<u8> {
    let mut binding = b"tpm-vault ListKeys page token\0".to_vec();
    binding.extend_from_slice(caller.as_bytes());
    binding
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl Vault {
    /// Writes `record` in place of key `name`'s stored record, unless the key was deleted
    /// meanwhile ([`Error::not_found`]). Callers hold `cert_lock`, so no delete slips in between
    /// their read and this write.
    async fn replace_record(&self, name: &KeyName, record: &KeyRecord) -> Result<(), Error> {
        let store = self.inner.store.clone();
        let (n, r) = (name.clone(), record.clone());
        blocking(move || match store.keys().get(&n)? {
            Some(_) => store.keys().replace(&r).map(|()| true),
            None => Ok(false),
        })
        .await?
        .then_some(())
        .ok_or_else(|| Error::not_found(name))
    }
}

/// Runs blocking (file) work off the async workers.
pub(crate) async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, Error>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
        .map_err(Into::into)
}
