//! The module's state and every operation, in safe Rust: the one slot and its token, the
//! sessions, the object cache, and the calls to the daemon. `entry` turns C arguments into
//! these calls and back.
//!
//! Locks are held only to read or swap state, never across a daemon call, so a slow TPM never
//! blocks another thread's session and `fork` never inherits a lock held by a thread that the
//! child does not have (the `pthread_atfork` hooks take both global locks around `fork`).

use std::collections::HashMap;
use std::sync::Arc;

use cryptoki_sys::*;
use parking_lot::Mutex;
use tpm_vault_client::algorithm::{self, Curve, TpmKey};
use tpm_vault_client::{Client, HashAlgorithm, KeyAuth, KeyInfo, SignOptions};
use zeroize::Zeroizing;

use crate::config::Config;
use crate::connection::{self, Retry};
use crate::error::{from_client, Doing, Result};
use crate::mechanism::{Hash, Input, Params, Sign};
use crate::objects::{self, Attr, Cert, Key, Object, Role};
use tpm_vault_client::Hasher;

/// The one slot's id.
pub(crate) const SLOT_ID: CK_SLOT_ID = 1;

/// The most random bytes one `C_GenerateRandom` returns.
const MAX_RANDOM: usize = 64 << 20;

/// Everything `C_Initialize` sets up.
#[derive(Debug)]
struct State {
    /// Settings, read once per process image (kept across `fork`).
    config: Arc<Config>,
    /// The process that initialized the module (or re-initialized it after a `fork`).
    pid: u32,
    /// Open sessions.
    sessions: HashMap<CK_SESSION_HANDLE, Arc<Mutex<Session>>>,
    /// The next session handle.
    next_session: CK_SESSION_HANDLE,
    /// Whether `C_Login(CKU_USER)` was called (the token needs no login; this only drives
    /// `C_GetSessionInfo`'s state).
    logged_in: bool,
    /// The objects as last read from the daemon.
    objects: Arc<Objects>,
}

/// The module's state; `None` before `C_Initialize` and after `C_Finalize`.
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The settings of the process image, kept when `C_Finalize` clears the rest, so that a child
/// of nginx (whose environment is cleared) that initializes again still finds the daemon.
static CONFIG: Mutex<Option<Arc<Config>>> = Mutex::new(None);

/// The objects the caller may see, by handle.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    /// In name order.
    list: Vec<Arc<Object>>,
    /// Public keys already fetched, by key name and TPM name (a key's public part never
    /// changes while its TPM name stays).
    keys: HashMap<(String, String), Arc<Key>>,
}

impl Objects {
    /// The object with `handle`.
    fn get(&self, handle: CK_OBJECT_HANDLE) -> Option<Arc<Object>> {
        self.list.iter().find(|o| o.handle == handle).cloned()
    }
}

/// One session.
#[derive(Debug)]
struct Session {
    /// `CKF_RW_SESSION` and `CKF_SERIAL_SESSION` as opened.
    flags: CK_FLAGS,
    /// An active `C_FindObjects*` search: the handles found and how many were returned.
    find: Option<(Vec<CK_OBJECT_HANDLE>, usize)>,
    /// An active signature.
    sign: Option<Operation>,
    /// An active verification.
    verify: Option<Operation>,
    /// An active digest.
    digest: Option<Hasher>,
}

/// A signature or verification in progress.
#[derive(Debug)]
struct Operation {
    /// The mechanism.
    mechanism: Sign,
    /// The key.
    key: Arc<Key>,
    /// The input so far.
    input: Input,
    /// The key's password, from `C_Login(CKU_CONTEXT_SPECIFIC)`.
    pin: Option<Zeroizing<Vec<u8>>>,
}

/// What a call that returns bytes produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// The caller asked for the length only (no buffer), or its buffer is too small
    /// (`true`); the operation stays active.
    Length(usize, bool),
    /// The bytes; the operation is over.
    Bytes(Zeroizing<Vec<u8>>),
}

/// `C_Initialize`.
///
/// # Errors
/// `CKR_CRYPTOKI_ALREADY_INITIALIZED` in the process that initialized; `CKR_GENERAL_ERROR`
/// when the config file is unreadable.
pub(crate) fn initialize() -> Result<()> {
    let mut state = STATE.lock();
    let pid = std::process::id();
    if let Some(current) = state.as_mut() {
        if current.pid == pid {
            return Err(CKR_CRYPTOKI_ALREADY_INITIALIZED);
        }
        // A forked child initializing again (libp11 does): the parent's sessions are not
        // ours, but the objects and their handles are the same.
        current.pid = pid;
        current.sessions.clear();
        current.logged_in = false;
        return Ok(());
    }
    FIRST_PID.get_or_init(|| pid);
    let config = {
        let mut kept = CONFIG.lock();
        match kept.as_ref() {
            Some(config) => Arc::clone(config),
            None => {
                let config = Arc::new(Config::load().map_err(|e| {
                    crate::debug(format_args!("config: {e}"));
                    CKR_GENERAL_ERROR
                })?);
                *kept = Some(Arc::clone(&config));
                config
            }
        }
    };
    *state = Some(State {
        config,
        pid,
        sessions: HashMap::new(),
        next_session: 1,
        logged_in: false,
        objects: Arc::new(Objects::default()),
    });
    Ok(())
}

/// `C_Finalize`: forgets the sessions and the connection. The settings stay (see [`CONFIG`])
/// unless the process initializes afresh in its own name (not a forked child).
///
/// # Errors
/// `CKR_CRYPTOKI_NOT_INITIALIZED`.
pub(crate) fn finalize() -> Result<()> {
    let old = STATE.lock().take().ok_or(CKR_CRYPTOKI_NOT_INITIALIZED)?;
    if old.pid == std::process::id() && !is_forked_image() {
        CONFIG.lock().take();
    }
    drop(old);
    connection::reset();
    Ok(())
}

/// True when this process is a `fork` of the one whose settings are kept (its environment
/// may have been cleared since, as nginx does).
fn is_forked_image() -> bool {
    FIRST_PID.get().is_some_and(|&pid| pid != std::process::id())
}

/// The process that first initialized the module.
pub(crate) static FIRST_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Runs `f` on the state.
fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
    let mut state = STATE.lock();
    f(state.as_mut().ok_or(CKR_CRYPTOKI_NOT_INITIALIZED)?)
}

/// The settings, or `CKR_CRYPTOKI_NOT_INITIALIZED`.
pub(crate) fn config() -> Result<Arc<Config>> {
    with_state(|s| Ok(Arc::clone(&s.config)))
}

/// Checks the slot id.
///
/// # Errors
/// `CKR_CRYPTOKI_NOT_INITIALIZED`, `CKR_SLOT_ID_INVALID`.
pub(crate) fn check_slot(slot: CK_SLOT_ID) -> Result<()> {
    with_state(|_| if slot == SLOT_ID { Ok(()) } else { Err(CKR_SLOT_ID_INVALID) })
}

/// The session `handle`.
fn session(handle: CK_SESSION_HANDLE) -> Result<Arc<Mutex<Session>>> {
    with_state(|s| s.sessions.get(&handle).cloned().ok_or(CKR_SESSION_HANDLE_INVALID))
}

/// `C_OpenSession`.
///
/// # Errors
/// `CKR_SLOT_ID_INVALID`, `CKR_SESSION_PARALLEL_NOT_SUPPORTED` without `CKF_SERIAL_SESSION`.
pub(crate) fn open_session(slot: CK_SLOT_ID, flags: CK_FLAGS) -> Result<CK_SESSION_HANDLE> {
    check_slot(slot)?;
    if flags & CKF_SERIAL_SESSION == 0 {
        return Err(CKR_SESSION_PARALLEL_NOT_SUPPORTED);
    }
    with_state(|s| {
        let handle = s.next_session;
        s.next_session += 1;
        let session = Session { flags, find: None, sign: None, verify: None, digest: None };
        s.sessions.insert(handle, Arc::new(Mutex::new(session)));
        Ok(handle)
    })
}

/// `C_CloseSession`.
///
/// # Errors
/// `CKR_SESSION_HANDLE_INVALID`.
pub(crate) fn close_session(handle: CK_SESSION_HANDLE) -> Result<()> {
    with_state(|s| {
        s.sessions.remove(&handle).ok_or(CKR_SESSION_HANDLE_INVALID)?;
        if s.sessions.is_empty() {
            s.logged_in = false;
        }
        Ok(())
    })
}

/// `C_CloseAllSessions`.
///
/// # Errors
/// `CKR_SLOT_ID_INVALID`.
pub(crate) fn close_all_sessions(slot: CK_SLOT_ID) -> Result<()> {
    check_slot(slot)?;
    with_state(|s| {
        s.sessions.clear();
        s.logged_in = false;
        Ok(())
    })
}

/// Open sessions: (all, read-write).
pub(crate) fn session_counts() -> Result<(usize, usize)> {
    with_state(|s| {
        let rw = s.sessions.values().filter(|x| x.lock().flags & CKF_RW_SESSION != 0).count();
        Ok((s.sessions.len(), rw))
    })
}

/// `C_GetSessionInfo`: (state, flags).
///
/// # Errors
/// `CKR_SESSION_HANDLE_INVALID`.
pub(crate) fn session_info(handle: CK_SESSION_HANDLE) -> Result<(CK_STATE, CK_FLAGS)> {
    let flags = session(handle)?.lock().flags;
    let logged_in = with_state(|s| Ok(s.logged_in))?;
    let rw = flags & CKF_RW_SESSION != 0;
    let state = match (logged_in, rw) {
        (true, true) => CKS_RW_USER_FUNCTIONS,
        (true, false) => CKS_RO_USER_FUNCTIONS,
        (false, true) => CKS_RW_PUBLIC_SESSION,
        (false, false) => CKS_RO_PUBLIC_SESSION,
    };
    Ok((state, flags))
}

/// `C_Login`: the token needs no PIN, so a user login always succeeds; a context-specific
/// login gives the password of the key of the active signature.
///
/// # Errors
/// `CKR_USER_TYPE_INVALID` for the security officer, `CKR_OPERATION_NOT_INITIALIZED` for a
/// context-specific login without a signature in progress, `CKR_PIN_LEN_RANGE`.
pub(crate) fn login(handle: CK_SESSION_HANDLE, user: CK_USER_TYPE, pin: Zeroizing<Vec<u8>>) -> Result<()> {
    let session = session(handle)?;
    match user {
        CKU_USER => with_state(|s| {
            s.logged_in = true;
            Ok(())
        }),
        CKU_CONTEXT_SPECIFIC => {
            if pin.len() > tpm_vault_client::MAX_KEY_AUTH {
                return Err(CKR_PIN_LEN_RANGE);
            }
            let mut session = session.lock();
            let op = session.sign.as_mut().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
            op.pin = Some(pin);
            Ok(())
        }
        CKU_SO => Err(CKR_USER_TYPE_INVALID),
        _ => Err(CKR_USER_TYPE_INVALID),
    }
}

/// `C_Logout`.
///
/// # Errors
/// `CKR_SESSION_HANDLE_INVALID`, `CKR_USER_NOT_LOGGED_IN`.
pub(crate) fn logout(handle: CK_SESSION_HANDLE) -> Result<()> {
    session(handle)?;
    with_state(|s| {
        if !s.logged_in {
            return Err(CKR_USER_NOT_LOGGED_IN);
        }
        s.logged_in = false;
        Ok(())
    })
}

/// Calls the daemon (see [`connection::call`]), mapping a failure per `doing`.
fn daemon<T, F, Fut>(retry: Retry, doing: Doing, f: F) -> Result<T>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, tpm_vault_client::Error>>,
{
    let config = config()?;
    connection::call(&config.socket, retry, f).map_err(|e| from_client(&e, doing))
}

/// Reads every key the caller may see, with public keys and chains, and replaces the cache.
///
/// # Errors
/// `CKR_DEVICE_ERROR` when the daemon cannot be reached, and the other daemon errors.
fn refresh() -> Result<Arc<Objects>> {
    let known = with_state(|s| Ok(s.objects.keys.clone()))?;
    let fresh = daemon(Retry::Idempotent, Doing::Other, |client| {
        let known = known.clone();
        async move { read_objects(&client, known).await }
    })?;
    let fresh = Arc::new(fresh);
    with_state(|s| {
        s.objects = Arc::clone(&fresh);
        Ok(())
    })?;
    Ok(fresh)
}

/// [`refresh`]'s daemon calls: the key list, then each new key's public part and each key's
/// chain. A key deleted meanwhile is left out.
async fn read_objects(
    client: &Client,
    known: HashMap<(String, String), Arc<Key>>,
) -> std::result::Result<Objects, tpm_vault_client::Error> {
    let mut objects = Objects::default();
    for info in client.list_keys().await? {
        if !usable(&info) {
            continue;
        }
        let id = (info.name.clone(), info.tpm_name.clone());
        let key = match known.get(&id) {
            Some(key) => Arc::clone(key),
            None => match client.public_key(&info.name).await {
                Ok(public) => match Key::new(&info, public.der) {
                    Some(key) => Arc::new(key),
                    None => continue,
                },
                Err(e) if e.code() == tpm_vault_client::Code::NotFound => continue,
                Err(e) => return Err(e),
            },
        };
        let chain = match client.certificate(&info.name).await {
            Ok(chain) => Cert::chain(&chain.chain_pem).unwrap_or_default(),
            Err(e) if e.code() == tpm_vault_client::Code::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        objects.list.extend(objects::objects(&key, &chain).into_iter().map(Arc::new));
        objects.keys.insert(id, key);
    }
    Ok(objects)
}

/// Keys PKCS#11 can sign with here (not ML-KEM, not hybrid).
fn usable(info: &KeyInfo) -> bool {
    objects::usable(info.algorithm)
}

/// The object `handle`, from the cache or, if it is not there, after reading the daemon's
/// keys again (a process that never searched, or a key made by another process).
///
/// # Errors
/// `CKR_OBJECT_HANDLE_INVALID`, daemon errors.
fn object(handle: CK_OBJECT_HANDLE) -> Result<Arc<Object>> {
    let cached = with_state(|s| Ok(s.objects.get(handle)))?;
    match cached {
        Some(object) => Ok(object),
        None => refresh()?.get(handle).ok_or(CKR_OBJECT_HANDLE_INVALID),
    }
}

/// `C_FindObjectsInit`: reads the keys afresh and keeps the handles that match.
///
/// # Errors
/// `CKR_OPERATION_ACTIVE`, daemon errors.
pub(crate) fn find_init(handle: CK_SESSION_HANDLE, template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)]) -> Result<()> {
    let session = session(handle)?;
    if session.lock().find.is_some() {
        return Err(CKR_OPERATION_ACTIVE);
    }
    let objects = refresh()?;
    let found: Vec<CK_OBJECT_HANDLE> = objects.list.iter().filter(|o| o.matches(template)).map(|o| o.handle).collect();
    crate::debug(format_args!(
        "find {:?}: {} objects",
        template.iter().map(|(t, v)| (*t, v.len())).collect::<Vec<_>>(),
        found.len()
    ));
    session.lock().find = Some((found, 0));
    Ok(())
}

/// `C_FindObjects`: up to `max` more handles.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`.
pub(crate) fn find(handle: CK_SESSION_HANDLE, max: usize) -> Result<Vec<CK_OBJECT_HANDLE>> {
    let session = session(handle)?;
    let mut session = session.lock();
    let (found, next) = session.find.as_mut().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
    let end = found.len().min(next.saturating_add(max));
    let out = found[*next..end].to_vec();
    *next = end;
    Ok(out)
}

/// `C_FindObjectsFinal`.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`.
pub(crate) fn find_final(handle: CK_SESSION_HANDLE) -> Result<()> {
    session(handle)?.lock().find.take().map(|_| ()).ok_or(CKR_OPERATION_NOT_INITIALIZED)
}

/// `C_GetAttributeValue`: each requested attribute's value, or why not.
///
/// # Errors
/// `CKR_SESSION_HANDLE_INVALID`, `CKR_OBJECT_HANDLE_INVALID`.
pub(crate) fn attributes(
    handle: CK_SESSION_HANDLE,
    object_handle: CK_OBJECT_HANDLE,
    kinds: &[CK_ATTRIBUTE_TYPE],
) -> Result<Vec<Option<Attr>>> {
    session(handle)?;
    let object = object(object_handle)?;
    Ok(kinds.iter().map(|&k| object.attr(k).cloned()).collect())
}

/// `C_GetObjectSize`: the bytes of its attribute values.
///
/// # Errors
/// As [`attributes`].
pub(crate) fn object_size(handle: CK_SESSION_HANDLE, object_handle: CK_OBJECT_HANDLE) -> Result<usize> {
    session(handle)?;
    let object = object(object_handle)?;
    let value = object.attr(CKA_VALUE).or(object.attr(CKA_PUBLIC_KEY_INFO));
    Ok(match value {
        Some(Attr::Value(v)) => v.len(),
        _ => 0,
    })
}

/// `C_SignInit` / `C_VerifyInit`.
///
/// # Errors
/// `CKR_OPERATION_ACTIVE`, `CKR_KEY_HANDLE_INVALID`, `CKR_KEY_TYPE_INCONSISTENT`,
/// `CKR_KEY_FUNCTION_NOT_PERMITTED` (signing with a public key or a key without the `sign`
/// usage, verifying with a certificate), mechanism errors.
pub(crate) fn operation_init(
    handle: CK_SESSION_HANDLE,
    kind: CK_MECHANISM_TYPE,
    params: &Params,
    key_handle: CK_OBJECT_HANDLE,
    verify: bool,
) -> Result<()> {
    let session = session(handle)?;
    if !verify {
        refuse_setuid_signing()?;
    }
    {
        let session = session.lock();
        let active = if verify { session.verify.is_some() } else { session.sign.is_some() };
        if active {
            return Err(CKR_OPERATION_ACTIVE);
        }
    }
    let object =
        object(key_handle).map_err(|e| if e == CKR_OBJECT_HANDLE_INVALID { CKR_KEY_HANDLE_INVALID } else { e })?;
    let role_fits = match object.role {
        Role::Private => !verify,
        Role::Public => verify,
        Role::Certificate(_) => false,
    };
    if object.role == Role::Private && !object.key.can_sign {
        return Err(CKR_KEY_FUNCTION_NOT_PERMITTED);
    }
    if !role_fits {
        return Err(if matches!(object.role, Role::Certificate(_)) {
            CKR_KEY_HANDLE_INVALID
        } else {
            CKR_KEY_FUNCTION_NOT_PERMITTED
        });
    }
    let mechanism = Sign::new(kind, params, &object.key)?;
    let op = Operation { mechanism, key: Arc::clone(&object.key), input: mechanism.input()?, pin: None };
    let mut session = session.lock();
    let slot = if verify { &mut session.verify } else { &mut session.sign };
    if slot.is_some() {
        return Err(CKR_OPERATION_ACTIVE);
    }
    *slot = Some(op);
    Ok(())
}

/// `C_SignUpdate` / `C_VerifyUpdate`. An error ends the operation.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`, `CKR_DATA_LEN_RANGE`.
pub(crate) fn operation_update(handle: CK_SESSION_HANDLE, data: &[u8], verify: bool) -> Result<()> {
    let session = session(handle)?;
    let mut session = session.lock();
    let slot = if verify { &mut session.verify } else { &mut session.sign };
    let op = slot.as_mut().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
    let result = op.input.update(data);
    if result.is_err() {
        *slot = None;
    }
    result
}

/// `C_Sign` (`data` given) / `C_SignFinal` (`None`): the signature if `capacity` holds it,
/// else its length with the operation still active.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`, `CKR_USER_NOT_LOGGED_IN` (a password key before its
/// context-specific login; the operation stays active), input and daemon errors (which end it).
pub(crate) fn sign(handle: CK_SESSION_HANDLE, data: Option<&[u8]>, capacity: Option<usize>) -> Result<Output> {
    let session = session(handle)?;
    let mut op = {
        let mut session = session.lock();
        let op = session.sign.as_ref().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
        let len = op.key.signature_len();
        match capacity {
            None => return Ok(Output::Length(len, false)),
            Some(c) if c < len => return Ok(Output::Length(len, true)),
            Some(_) => {}
        }
        if op.key.has_auth && op.pin.is_none() {
            return Err(CKR_USER_NOT_LOGGED_IN);
        }
        session.sign.take().ok_or(CKR_OPERATION_NOT_INITIALIZED)?
    };
    refuse_setuid_signing()?;
    if let Some(data) = data {
        op.input.update(data)?;
    }
    let key = Arc::clone(&op.key);
    let (input, hash, scheme) = op.mechanism.request(&key, op.input)?;
    if hash == HashAlgorithm::Sha1 && op.mechanism == Sign::RsaPkcs(None) && !config()?.allow_sha1_digest_info {
        crate::debug(format_args!("CKM_RSA_PKCS with a SHA-1 DigestInfo: refused (allow_sha1_digest_info)"));
        return Err(CKR_DATA_INVALID);
    }
    let mut options = SignOptions::new().with_hash(hash).with_scheme(scheme);
    if let Some(pin) = op.pin.take() {
        options = options.with_auth(KeyAuth::new(pin).map_err(|_| CKR_PIN_LEN_RANGE)?);
    }
    let signature = daemon(Retry::Idempotent, Doing::Sign, |client| {
        let (name, input, options) = (key.name.clone(), input.clone(), options.clone());
        async move { client.sign(&name, input, &options).await }
    })?;
    Ok(Output::Bytes(Zeroizing::new(op.mechanism.encode(&key, signature.bytes())?)))
}

/// Refuses to sign while the real and effective uid differ: a setuid program (a login stack
/// under `su`, a PAM module) would sign with the root-authenticated connection for a caller
/// who checked no PIN.
///
/// # Errors
/// `CKR_FUNCTION_FAILED`.
fn refuse_setuid_signing() -> Result<()> {
    if crate::config::uids_differ() {
        crate::debug(format_args!("real and effective uid differ: signing refused"));
        return Err(CKR_FUNCTION_FAILED);
    }
    Ok(())
}

/// `C_Verify` (`data` given) / `C_VerifyFinal` (`None`), in-core. Ends the operation.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`, `CKR_SIGNATURE_INVALID`, `CKR_SIGNATURE_LEN_RANGE`, input
/// errors.
pub(crate) fn verify(handle: CK_SESSION_HANDLE, data: Option<&[u8]>, signature: &[u8]) -> Result<()> {
    let session = session(handle)?;
    let mut op = session.lock().verify.take().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
    if let Some(data) = data {
        op.input.update(data)?;
    }
    op.mechanism.verify(&op.key, op.input, signature)
}

/// `C_DigestInit`.
///
/// # Errors
/// `CKR_OPERATION_ACTIVE`, `CKR_MECHANISM_INVALID`, `CKR_MECHANISM_PARAM_INVALID`.
pub(crate) fn digest_init(handle: CK_SESSION_HANDLE, kind: CK_MECHANISM_TYPE, params: &Params) -> Result<()> {
    let session = session(handle)?;
    let hash = Hash::from_mechanism(kind).ok_or(CKR_MECHANISM_INVALID)?;
    if *params != Params::None {
        return Err(CKR_MECHANISM_PARAM_INVALID);
    }
    let mut session = session.lock();
    if session.digest.is_some() {
        return Err(CKR_OPERATION_ACTIVE);
    }
    session.digest = Some(hash.hasher()?);
    Ok(())
}

/// `C_DigestUpdate`.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`.
pub(crate) fn digest_update(handle: CK_SESSION_HANDLE, data: &[u8]) -> Result<()> {
    let session = session(handle)?;
    let mut session = session.lock();
    session.digest.as_mut().ok_or(CKR_OPERATION_NOT_INITIALIZED)?.update(data);
    Ok(())
}

/// `C_Digest` (`data` given) / `C_DigestFinal` (`None`), with the two-call convention.
///
/// # Errors
/// `CKR_OPERATION_NOT_INITIALIZED`.
pub(crate) fn digest(handle: CK_SESSION_HANDLE, data: Option<&[u8]>, capacity: Option<usize>) -> Result<Output> {
    let session = session(handle)?;
    let mut session = session.lock();
    let len = session.digest.as_ref().ok_or(CKR_OPERATION_NOT_INITIALIZED)?.len();
    match capacity {
        None => return Ok(Output::Length(len, false)),
        Some(c) if c < len => return Ok(Output::Length(len, true)),
        Some(_) => {}
    }
    let mut hasher = session.digest.take().ok_or(CKR_OPERATION_NOT_INITIALIZED)?;
    if let Some(data) = data {
        hasher.update(data);
    }
    Ok(Output::Bytes(Zeroizing::new(hasher.finish())))
}

/// `C_GenerateRandom`: bytes from the daemon's DRBG.
///
/// # Errors
/// `CKR_ARGUMENTS_BAD` past 64 MiB, daemon errors.
pub(crate) fn random(handle: CK_SESSION_HANDLE, len: usize) -> Result<Vec<u8>> {
    session(handle)?;
    if len > MAX_RANDOM {
        return Err(CKR_ARGUMENTS_BAD);
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    daemon(Retry::Idempotent, Doing::Other, |client| async move { client.random(len).await })
}

/// A template's attribute as a `CK_ULONG`.
fn template_ulong(template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)], kind: CK_ATTRIBUTE_TYPE) -> Result<Option<CK_ULONG>> {
    match template.iter().find(|(t, _)| *t == kind) {
        None => Ok(None),
        Some((_, v)) => {
            let bytes: [u8; std::mem::size_of::<CK_ULONG>()] =
                v.as_slice().try_into().map_err(|_| CKR_ATTRIBUTE_VALUE_INVALID)?;
            Ok(Some(CK_ULONG::from_ne_bytes(bytes)))
        }
    }
}

/// A template's attribute as bytes.
fn template_bytes(template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)], kind: CK_ATTRIBUTE_TYPE) -> Option<&[u8]> {
    template.iter().find(|(t, _)| *t == kind).map(|(_, v)| v.as_slice())
}

/// Refuses a template that asks for a key weaker than a vault key: a session object, or a
/// private key that is extractable or not sensitive. Usage flags the key cannot have
/// (`CKA_DERIVE`, `CKA_DECRYPT`, `CKA_ENCRYPT`, `CKA_WRAP`, ... which pkcs11-tool sets by default)
/// are ignored: a vault key signs only, and its attributes say so.
fn check_key_template(public: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)], private: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)]) -> Result<()> {
    let is = |template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)], kind, want: bool| {
        template_bytes(template, kind).is_none_or(|v| v.first().is_some_and(|&b| (b != 0) == want))
    };
    let ok = is(public, CKA_TOKEN, true)
        && is(private, CKA_TOKEN, true)
        && is(private, CKA_EXTRACTABLE, false)
        && is(private, CKA_SENSITIVE, true);
    if ok {
        Ok(())
    } else {
        Err(CKR_TEMPLATE_INCONSISTENT)
    }
}

/// `C_GenerateKeyPair`: creates a vault key named by `CKA_LABEL`; returns (public, private)
/// handles. `CKA_ID` in a template is ignored: the id is always the subject key identifier.
///
/// # Errors
/// `CKR_MECHANISM_INVALID`, `CKR_TEMPLATE_INCOMPLETE` (no label, no curve or size),
/// `CKR_TEMPLATE_INCONSISTENT`, `CKR_CURVE_NOT_SUPPORTED`, `CKR_KEY_SIZE_RANGE`,
/// `CKR_ATTRIBUTE_VALUE_INVALID` (a name the vault refuses or one already taken), daemon errors.
pub(crate) fn generate_key_pair(
    handle: CK_SESSION_HANDLE,
    kind: CK_MECHANISM_TYPE,
    public: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)],
    private: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)],
) -> Result<(CK_OBJECT_HANDLE, CK_OBJECT_HANDLE)> {
    session(handle)?;
    let algorithm = match kind {
        CKM_EC_KEY_PAIR_GEN => match template_bytes(public, CKA_EC_PARAMS) {
            Some(params) => {
                Curve::from_oid_der(params)
                    .and_then(|curve| algorithm::by_tpm_key(TpmKey::Ecc(curve)))
                    .ok_or(CKR_CURVE_NOT_SUPPORTED)?
                    .id
            }
            None => return Err(CKR_TEMPLATE_INCOMPLETE),
        },
        CKM_RSA_PKCS_KEY_PAIR_GEN => {
            if let Some(e) = template_bytes(public, CKA_PUBLIC_EXPONENT) {
                let significant: Vec<u8> = e.iter().copied().skip_while(|&b| b == 0).collect();
                if significant != [1, 0, 1] {
                    return Err(CKR_ATTRIBUTE_VALUE_INVALID);
                }
            }
            match template_ulong(public, CKA_MODULUS_BITS)? {
                Some(bits) => {
                    u16::try_from(bits)
                        .ok()
                        .and_then(|bits| algorithm::by_tpm_key(TpmKey::Rsa { bits }))
                        .ok_or(CKR_KEY_SIZE_RANGE)?
                        .id
                }
                None => return Err(CKR_TEMPLATE_INCOMPLETE),
            }
        }
        CKM_ML_DSA_KEY_PAIR_GEN => {
            let set = match template_ulong(public, CKA_PARAMETER_SET)? {
                Some(set) => Some(set),
                None => template_ulong(private, CKA_PARAMETER_SET)?,
            };
            match set {
                Some(set) => {
                    algorithm::ALL
                        .iter()
                        .find(|a| a.ml_dsa().map(objects::ml_dsa_parameter_set) == Some(set))
                        .ok_or(CKR_ATTRIBUTE_VALUE_INVALID)?
                        .id
                }
                None => return Err(CKR_TEMPLATE_INCOMPLETE),
            }
        }
        _ => return Err(CKR_MECHANISM_INVALID),
    };
    check_key_template(public, private)?;
    let label = template_bytes(private, CKA_LABEL).or_else(|| template_bytes(public, CKA_LABEL));
    let name = std::str::from_utf8(label.ok_or(CKR_TEMPLATE_INCOMPLETE)?).map_err(|_| CKR_ATTRIBUTE_VALUE_INVALID)?;
    let name = name.to_owned();
    let made = daemon(Retry::Once, Doing::Create, |client| {
        let name = name.clone();
        async move { client.create_key(&name, algorithm, None).await }
    })?;
    refresh()?;
    Ok((objects::handle(&made.name, Role::Public), objects::handle(&made.name, Role::Private)))
}

/// `C_CreateObject`: stores an X.509 certificate with the vault key whose public key it
/// certifies (the key named by `CKA_LABEL`, else the one with the same public key), replacing
/// that key's chain. Nothing else can be created: keys are made inside the TPM.
///
/// # Errors
/// `CKR_TEMPLATE_INCOMPLETE` (no `CKA_VALUE`), `CKR_TEMPLATE_INCONSISTENT` (not a certificate),
/// `CKR_ATTRIBUTE_VALUE_INVALID` (does not parse, or certifies no key here), daemon errors.
pub(crate) fn create_object(
    handle: CK_SESSION_HANDLE,
    template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)],
) -> Result<CK_OBJECT_HANDLE> {
    session(handle)?;
    if template_ulong(template, CKA_CLASS)? != Some(CKO_CERTIFICATE) {
        return Err(CKR_TEMPLATE_INCONSISTENT);
    }
    if template_ulong(template, CKA_CERTIFICATE_TYPE)?.is_some_and(|t| t != CKC_X_509) {
        return Err(CKR_TEMPLATE_INCONSISTENT);
    }
    let der = template_bytes(template, CKA_VALUE).ok_or(CKR_TEMPLATE_INCOMPLETE)?;
    let cert = Cert::from_der(der).ok_or(CKR_ATTRIBUTE_VALUE_INVALID)?;
    let objects = refresh()?;
    let label = template_bytes(template, CKA_LABEL);
    let key = objects
        .keys
        .values()
        .find(|k| label == Some(k.name.as_bytes()) && k.spki == cert.spki())
        .or_else(|| objects.keys.values().find(|k| k.spki == cert.spki()))
        .cloned()
        .ok_or(CKR_ATTRIBUTE_VALUE_INVALID)?;
    let pem = pem_certificate(cert.der())?;
    daemon(Retry::Idempotent, Doing::Create, |client| {
        let (name, pem) = (key.name.clone(), pem.clone());
        async move { client.set_certificate(&name, &pem).await }
    })?;
    refresh()?;
    Ok(objects::handle(&key.name, Role::Certificate(0)))
}

/// PEM "CERTIFICATE" of a DER certificate.
fn pem_certificate(der: &[u8]) -> Result<String> {
    x509_cert::der::pem::encode_string("CERTIFICATE", x509_cert::der::pem::LineEnding::LF, der)
        .map_err(|_| CKR_ATTRIBUTE_VALUE_INVALID)
}

/// `C_DestroyObject`: with `allow_destroy = true` in pkcs11.toml, a key object deletes the
/// vault key (both its objects go); a certificate cannot be removed from its key.
///
/// # Errors
/// `CKR_ACTION_PROHIBITED` (not allowed by the config, or a certificate),
/// `CKR_OBJECT_HANDLE_INVALID`, daemon errors.
pub(crate) fn destroy_object(handle: CK_SESSION_HANDLE, object_handle: CK_OBJECT_HANDLE) -> Result<()> {
    session(handle)?;
    if !config()?.allow_destroy {
        crate::debug(format_args!("C_DestroyObject refused: allow_destroy is off in the module's config"));
        return Err(CKR_ACTION_PROHIBITED);
    }
    let object = object(object_handle)?;
    if matches!(object.role, Role::Certificate(_)) {
        return Err(CKR_ACTION_PROHIBITED);
    }
    let name = object.key.name.clone();
    daemon(Retry::Once, Doing::Other, |client| {
        let name = name.clone();
        async move { client.delete_key(&name).await }
    })?;
    refresh()?;
    Ok(())
}

/// `pthread_atfork` hooks for the state locks, every session's lock and the handle table's:
/// a thread in the middle of `C_SignInit` or `C_FindObjects` on one session while another forks
/// would otherwise leave that session locked forever in the child.
pub(crate) mod fork {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::{Session, CONFIG, STATE};

    /// The sessions whose locks `prepare` took, for `release`.
    static HELD: Mutex<Vec<Arc<Mutex<Session>>>> = Mutex::new(Vec::new());

    /// Before `fork`: take the locks (state first, then the sessions, as every other path
    /// does; no path holds a session's lock while it takes the state's).
    pub(crate) fn prepare() {
        let state = STATE.lock();
        let sessions: Vec<_> = state.as_ref().map(|s| s.sessions.values().cloned().collect()).unwrap_or_default();
        for session in &sessions {
            std::mem::forget(session.lock());
        }
        *HELD.lock() = sessions;
        std::mem::forget(state);
        std::mem::forget(CONFIG.lock());
        crate::objects::fork::prepare();
    }

    /// After `fork`, in the parent: release them.
    pub(crate) fn parent() {
        crate::objects::fork::parent();
        let sessions = std::mem::take(&mut *HELD.lock());
        // SAFETY: `prepare` took these locks on this thread and forgot the guards.
        #[allow(unsafe_code)]
        unsafe {
            CONFIG.force_unlock();
            for session in &sessions {
                session.force_unlock();
            }
            STATE.force_unlock();
        }
    }

    /// After `fork`, in the child: start them afresh (see [`crate::reset_in_child`]).
    pub(crate) fn child() {
        crate::objects::fork::child();
        // SAFETY: in the child hook, on the locks `prepare` took on this thread (HELD is not
        // locked: `prepare` released it before the fork).
        #[allow(unsafe_code)]
        unsafe {
            crate::reset_in_child(&HELD);
            let sessions = std::mem::take(&mut *HELD.lock());
            crate::reset_in_child(&CONFIG);
            for session in &sessions {
                crate::reset_in_child(session);
            }
            crate::reset_in_child(&STATE);
        }
    }
}
