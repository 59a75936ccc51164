//! The C ABI: every PKCS#11 entry point, its function list and interface.
//!
//! Each function checks and copies its pointer arguments, calls `token`, and writes the
//! results back with the two-call convention (a null output buffer asks for the length; one too
//! small gets `CKR_BUFFER_TOO_SMALL` and the length, and the operation stays active). A panic
//! never crosses the boundary: `guard` turns it into `CKR_GENERAL_ERROR`.
//!
//! # Safety
//! The caller follows the PKCS#11 contract: every non-null pointer points to memory of the
//! size the arguments give, valid for the call. Null pointers where an argument is required
//! are refused with `CKR_ARGUMENTS_BAD`; nothing else can be checked from here.
#![allow(non_snake_case, clippy::missing_safety_doc, unsafe_code)]

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

use cryptoki_sys::*;
use zeroize::Zeroizing;

use crate::error::Result;
use crate::mechanism::{self, Params};
use crate::objects::Attr;
use crate::token::{self, Output, SLOT_ID};

/// Most attributes one template may hold.
const MAX_TEMPLATE: CK_ULONG = 4096;

/// Most bytes one attribute value in a template may hold.
const MAX_ATTRIBUTE: CK_ULONG = 1 << 20;

/// Most bytes one `C_Sign`, `C_*Update` or `C_Digest` input may hold (ML-DSA messages are the
/// largest the daemon takes).
const MAX_INPUT: CK_ULONG = 64 << 20;

/// Runs `f`, turning a panic into `CKR_GENERAL_ERROR`.
fn guard(f: impl FnOnce() -> Result<()>) -> CK_RV {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CKR_OK,
        Ok(Err(rv)) => rv,
        Err(_) => {
            crate::debug(format_args!("internal error (panic) caught at the C boundary"));
            CKR_GENERAL_ERROR
        }
    }
}

/// `len` bytes at `p` (any `p` if `len` is 0).
unsafe fn input<'a>(p: *const u8, len: CK_ULONG) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() || len > MAX_INPUT {
        return Err(if p.is_null() { CKR_ARGUMENTS_BAD } else { CKR_DATA_LEN_RANGE });
    }
    Ok(std::slice::from_raw_parts(p, len as usize))
}

/// Writes `value` to `p`.
unsafe fn put<T>(p: *mut T, value: T) -> Result<()> {
    if p.is_null() {
        return Err(CKR_ARGUMENTS_BAD);
    }
    p.write(value);
    Ok(())
}

/// The buffer the caller offers: `None` when it only asks for the length.
unsafe fn capacity(p: *mut u8, len: *mut CK_ULONG) -> Result<Option<usize>> {
    if len.is_null() {
        return Err(CKR_ARGUMENTS_BAD);
    }
    Ok(if p.is_null() { None } else { Some(*len as usize) })
}

/// Writes a call's output with the two-call convention.
unsafe fn output(out: Output, p: *mut u8, len: *mut CK_ULONG) -> Result<()> {
    match out {
        Output::Length(n, too_small) => {
            put(len, n as CK_ULONG)?;
            if too_small {
                Err(CKR_BUFFER_TOO_SMALL)
            } else {
                Ok(())
            }
        }
        Output::Bytes(bytes) => {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            put(len, bytes.len() as CK_ULONG)
        }
    }
}

/// Writes a list with the two-call convention.
unsafe fn list<T: Copy>(items: &[T], p: *mut T, count: *mut CK_ULONG) -> Result<()> {
    if count.is_null() {
        return Err(CKR_ARGUMENTS_BAD);
    }
    let room = *count as usize;
    *count = items.len() as CK_ULONG;
    if p.is_null() {
        return Ok(());
    }
    if room < items.len() {
        return Err(CKR_BUFFER_TOO_SMALL);
    }
    std::ptr::copy_nonoverlapping(items.as_ptr(), p, items.len());
    Ok(())
}

/// Copies a template's attributes.
unsafe fn template(p: *const CK_ATTRIBUTE, count: CK_ULONG) -> Result<Vec<(CK_ATTRIBUTE_TYPE, Vec<u8>)>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(CKR_ARGUMENTS_BAD);
    }
    if count > MAX_TEMPLATE {
        return Err(CKR_TEMPLATE_INCONSISTENT);
    }
    std::slice::from_raw_parts(p, count as usize)
        .iter()
        .map(|a| {
            if a.ulValueLen > MAX_ATTRIBUTE {
                return Err(CKR_ATTRIBUTE_VALUE_INVALID);
            }
            let value = if a.ulValueLen == 0 {
                Vec::new()
            } else if a.pValue.is_null() {
                return Err(CKR_ATTRIBUTE_VALUE_INVALID);
            } else {
                std::slice::from_raw_parts(a.pValue as *const u8, a.ulValueLen as usize).to_vec()
            };
            Ok((a.type_, value))
        })
        .collect()
}

/// Copies a mechanism and its parameters.
unsafe fn mechanism_arg(p: *const CK_MECHANISM) -> Result<(CK_MECHANISM_TYPE, Params)> {
    if p.is_null() {
        return Err(CKR_ARGUMENTS_BAD);
    }
    let m = &*p;
    let len = m.ulParameterLen as usize;
    let params = if m.pParameter.is_null() || len == 0 {
        Params::None
    } else if m.mechanism == CKM_ML_DSA && len == std::mem::size_of::<CK_SIGN_ADDITIONAL_CONTEXT>() {
        let c = &*(m.pParameter as *const CK_SIGN_ADDITIONAL_CONTEXT);
        Params::Context { hedge: c.hedgeVariant, context_len: c.ulContextLen }
    } else if len == std::mem::size_of::<CK_RSA_PKCS_PSS_PARAMS>() {
        let pss = &*(m.pParameter as *const CK_RSA_PKCS_PSS_PARAMS);
        Params::Pss { hash: pss.hashAlg, mgf: pss.mgf, salt: pss.sLen }
    } else {
        Params::Other
    };
    Ok((m.mechanism, params))
}

/// Copies `text` into a fixed-width, space-padded PKCS#11 field (cut at a character boundary).
fn pad(field: &mut [u8], text: &str) {
    field.fill(b' ');
    let mut end = text.len().min(field.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    field[..end].copy_from_slice(&text.as_bytes()[..end]);
}

/// The module's version, from the crate's.
fn version() -> CK_VERSION {
    let major = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0);
    let minor = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0);
    CK_VERSION { major, minor }
}

/// The PKCS#11 version of the function list (2.40: every entry point it holds).
const CRYPTOKI: CK_VERSION = CK_VERSION { major: 2, minor: 40 };

/// Registers the fork hooks once.
fn register_fork_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn prepare() {
        token::fork::prepare();
        crate::connection::fork::prepare();
    }
    extern "C" fn parent() {
        crate::connection::fork::parent();
        token::fork::parent();
    }
    extern "C" fn child() {
        crate::connection::fork::child();
        token::fork::child();
    }
    ONCE.call_once(|| {
        // SAFETY: the hooks are plain functions of this library; glibc unregisters them if the
        // library is unloaded.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            crate::debug(format_args!("pthread_atfork failed ({rc})"));
        }
    });
}

/// `C_Initialize`.
#[no_mangle]
pub unsafe extern "C" fn C_Initialize(init_args: *mut c_void) -> CK_RV {
    guard(|| {
        if !init_args.is_null() {
            let args = &*(init_args as *const CK_C_INITIALIZE_ARGS);
            if !args.pReserved.is_null() {
                return Err(CKR_ARGUMENTS_BAD);
            }
            let given = [
                args.CreateMutex.is_some(),
                args.DestroyMutex.is_some(),
                args.LockMutex.is_some(),
                args.UnlockMutex.is_some(),
            ];
            if given.iter().any(|&g| g) && !given.iter().all(|&g| g) {
                return Err(CKR_ARGUMENTS_BAD);
            }
            // Application locks without permission to use the OS's: the module cannot use them.
            if given[0] && args.flags & CKF_OS_LOCKING_OK == 0 {
                return Err(CKR_CANT_LOCK);
            }
        }
        crate::init_debug();
        register_fork_hooks();
        token::initialize()
    })
}

/// `C_Finalize`.
#[no_mangle]
pub unsafe extern "C" fn C_Finalize(reserved: *mut c_void) -> CK_RV {
    guard(|| {
        if !reserved.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        token::finalize()
    })
}

/// `C_GetInfo`.
#[no_mangle]
pub unsafe extern "C" fn C_GetInfo(info: *mut CK_INFO) -> CK_RV {
    guard(|| {
        token::config()?;
        let mut out = CK_INFO {
            cryptokiVersion: CRYPTOKI,
            manufacturerID: [0; 32],
            flags: 0,
            libraryDescription: [0; 32],
            libraryVersion: version(),
        };
        pad(&mut out.manufacturerID, "tpm-vault");
        pad(&mut out.libraryDescription, "tpm-vault PKCS#11 module");
        put(info, out)
    })
}

/// The function list `C_GetFunctionList` returns.
static FUNCTIONS: CK_FUNCTION_LIST = CK_FUNCTION_LIST {
    version: CRYPTOKI,
    C_Initialize: Some(C_Initialize),
    C_Finalize: Some(C_Finalize),
    C_GetInfo: Some(C_GetInfo),
    C_GetFunctionList: Some(C_GetFunctionList),
    C_GetSlotList: Some(C_GetSlotList),
    C_GetSlotInfo: Some(C_GetSlotInfo),
    C_GetTokenInfo: Some(C_GetTokenInfo),
    C_GetMechanismList: Some(C_GetMechanismList),
    C_GetMechanismInfo: Some(C_GetMechanismInfo),
    C_InitToken: Some(C_InitToken),
    C_InitPIN: Some(C_InitPIN),
    C_SetPIN: Some(C_SetPIN),
    C_OpenSession: Some(C_OpenSession),
    C_CloseSession: Some(C_CloseSession),
    C_CloseAllSessions: Some(C_CloseAllSessions),
    C_GetSessionInfo: Some(C_GetSessionInfo),
    C_GetOperationState: Some(C_GetOperationState),
    C_SetOperationState: Some(C_SetOperationState),
    C_Login: Some(C_Login),
    C_Logout: Some(C_Logout),
    C_CreateObject: Some(C_CreateObject),
    C_CopyObject: Some(C_CopyObject),
    C_DestroyObject: Some(C_DestroyObject),
    C_GetObjectSize: Some(C_GetObjectSize),
    C_GetAttributeValue: Some(C_GetAttributeValue),
    C_SetAttributeValue: Some(C_SetAttributeValue),
    C_FindObjectsInit: Some(C_FindObjectsInit),
    C_FindObjects: Some(C_FindObjects),
    C_FindObjectsFinal: Some(C_FindObjectsFinal),
    C_EncryptInit: Some(C_EncryptInit),
    C_Encrypt: Some(C_Encrypt),
    C_EncryptUpdate: Some(C_EncryptUpdate),
    C_EncryptFinal: Some(C_EncryptFinal),
    C_DecryptInit: Some(C_DecryptInit),
    C_Decrypt: Some(C_Decrypt),
    C_DecryptUpdate: Some(C_DecryptUpdate),
    C_DecryptFinal: Some(C_DecryptFinal),
    C_DigestInit: Some(C_DigestInit),
    C_Digest: Some(C_Digest),
    C_DigestUpdate: Some(C_DigestUpdate),
    C_DigestKey: Some(C_DigestKey),
    C_DigestFinal: Some(C_DigestFinal),
    C_SignInit: Some(C_SignInit),
    C_Sign: Some(C_Sign),
    C_SignUpdate: Some(C_SignUpdate),
    C_SignFinal: Some(C_SignFinal),
    C_SignRecoverInit: Some(C_SignRecoverInit),
    C_SignRecover: Some(C_SignRecover),
    C_VerifyInit: Some(C_VerifyInit),
    C_Verify: Some(C_Verify),
    C_VerifyUpdate: Some(C_VerifyUpdate),
    C_VerifyFinal: Some(C_VerifyFinal),
    C_VerifyRecoverInit: Some(C_VerifyRecoverInit),
    C_VerifyRecover: Some(C_VerifyRecover),
    C_DigestEncryptUpdate: Some(C_DigestEncryptUpdate),
    C_DecryptDigestUpdate: Some(C_DecryptDigestUpdate),
    C_SignEncryptUpdate: Some(C_SignEncryptUpdate),
    C_DecryptVerifyUpdate: Some(C_DecryptVerifyUpdate),
    C_GenerateKey: Some(C_GenerateKey),
    C_GenerateKeyPair: Some(C_GenerateKeyPair),
    C_WrapKey: Some(C_WrapKey),
    C_UnwrapKey: Some(C_UnwrapKey),
    C_DeriveKey: Some(C_DeriveKey),
    C_SeedRandom: Some(C_SeedRandom),
    C_GenerateRandom: Some(C_GenerateRandom),
    C_GetFunctionStatus: Some(C_GetFunctionStatus),
    C_CancelFunction: Some(C_CancelFunction),
    C_WaitForSlotEvent: Some(C_WaitForSlotEvent),
};

/// `C_GetFunctionList`: the module's entry points (PKCS#11 2.40 layout).
#[no_mangle]
pub unsafe extern "C" fn C_GetFunctionList(list: *mut *mut CK_FUNCTION_LIST) -> CK_RV {
    guard(|| put(list, std::ptr::addr_of!(FUNCTIONS) as *mut CK_FUNCTION_LIST))
}

/// The interface's name.
static INTERFACE_NAME: &[u8] = b"PKCS 11\0";

/// The one interface: "PKCS 11" with the 2.40 function list (PKCS#11 3.0 §5.2).
struct Interface(CK_INTERFACE);

// SAFETY: the interface only points at immutable statics.
unsafe impl Sync for Interface {}

/// [`Interface`]'s one value.
static INTERFACE: Interface = Interface(CK_INTERFACE {
    pInterfaceName: INTERFACE_NAME.as_ptr() as *mut CK_UTF8CHAR,
    pFunctionList: std::ptr::addr_of!(FUNCTIONS) as *mut c_void,
    flags: CKF_INTERFACE_FORK_SAFE,
});

/// `C_GetInterfaceList` (PKCS#11 3.0).
#[no_mangle]
pub unsafe extern "C" fn C_GetInterfaceList(list: *mut CK_INTERFACE, count: *mut CK_ULONG) -> CK_RV {
    guard(|| {
        let one = CK_INTERFACE { ..INTERFACE.0 };
        if count.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let room = *count;
        *count = 1;
        if list.is_null() {
            return Ok(());
        }
        if room < 1 {
            return Err(CKR_BUFFER_TOO_SMALL);
        }
        list.write(one);
        Ok(())
    })
}

/// `C_GetInterface` (PKCS#11 3.0): "PKCS 11" (or the default, with a null name) at version 2.x.
#[no_mangle]
pub unsafe extern "C" fn C_GetInterface(
    name: *mut CK_UTF8CHAR,
    version: *mut CK_VERSION,
    interface: *mut *mut CK_INTERFACE,
    _flags: CK_FLAGS,
) -> CK_RV {
    guard(|| {
        if !name.is_null() && std::ffi::CStr::from_ptr(name as *const std::ffi::c_char).to_bytes() != b"PKCS 11" {
            return Err(CKR_ARGUMENTS_BAD);
        }
        if !version.is_null() && ((*version).major != CRYPTOKI.major) {
            return Err(CKR_ARGUMENTS_BAD);
        }
        put(interface, std::ptr::addr_of!(INTERFACE.0) as *mut CK_INTERFACE)
    })
}

/// `C_GetSlotList`: the one slot, which always holds the token.
#[no_mangle]
pub unsafe extern "C" fn C_GetSlotList(_present: CK_BBOOL, slots: *mut CK_SLOT_ID, count: *mut CK_ULONG) -> CK_RV {
    guard(|| {
        token::config()?;
        list(&[SLOT_ID], slots, count)
    })
}

/// `C_GetSlotInfo`.
#[no_mangle]
pub unsafe extern "C" fn C_GetSlotInfo(slot: CK_SLOT_ID, info: *mut CK_SLOT_INFO) -> CK_RV {
    guard(|| {
        token::check_slot(slot)?;
        let mut out = CK_SLOT_INFO {
            slotDescription: [0; 64],
            manufacturerID: [0; 32],
            flags: CKF_TOKEN_PRESENT | CKF_HW_SLOT,
            hardwareVersion: CK_VERSION { major: 2, minor: 0 },
            firmwareVersion: version(),
        };
        pad(&mut out.slotDescription, "tpm-vault daemon (TPM 2.0 key vault)");
        pad(&mut out.manufacturerID, "tpm-vault");
        put(info, out)
    })
}

/// `C_GetTokenInfo`.
#[no_mangle]
pub unsafe extern "C" fn C_GetTokenInfo(slot: CK_SLOT_ID, info: *mut CK_TOKEN_INFO) -> CK_RV {
    guard(|| {
        token::check_slot(slot)?;
        let config = token::config()?;
        let (sessions, rw) = token::session_counts()?;
        let mut out = CK_TOKEN_INFO {
            label: [0; 32],
            manufacturerID: [0; 32],
            model: [0; 16],
            serialNumber: [0; 16],
            flags: CKF_RNG | CKF_TOKEN_INITIALIZED,
            ulMaxSessionCount: CK_EFFECTIVELY_INFINITE,
            ulSessionCount: sessions as CK_ULONG,
            ulMaxRwSessionCount: CK_EFFECTIVELY_INFINITE,
            ulRwSessionCount: rw as CK_ULONG,
            ulMaxPinLen: tpm_vault_client::MAX_KEY_AUTH as CK_ULONG,
            ulMinPinLen: 0,
            ulTotalPublicMemory: CK_UNAVAILABLE_INFORMATION,
            ulFreePublicMemory: CK_UNAVAILABLE_INFORMATION,
            ulTotalPrivateMemory: CK_UNAVAILABLE_INFORMATION,
            ulFreePrivateMemory: CK_UNAVAILABLE_INFORMATION,
            hardwareVersion: CK_VERSION { major: 2, minor: 0 },
            firmwareVersion: version(),
            utcTime: [b' '; 16],
        };
        pad(&mut out.label, &config.token_label);
        pad(&mut out.manufacturerID, "tpm-vault");
        pad(&mut out.model, "TPM 2.0 vault");
        let serial =
            sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(config.token_label.as_bytes()));
        let hex: String = serial.iter().take(8).map(|b| format!("{b:02x}")).collect();
        pad(&mut out.serialNumber, &hex);
        put(info, out)
    })
}

/// `C_GetMechanismList`.
#[no_mangle]
pub unsafe extern "C" fn C_GetMechanismList(
    slot: CK_SLOT_ID,
    mechanisms: *mut CK_MECHANISM_TYPE,
    count: *mut CK_ULONG,
) -> CK_RV {
    guard(|| {
        token::check_slot(slot)?;
        list(&mechanism::list(), mechanisms, count)
    })
}

/// `C_GetMechanismInfo`.
#[no_mangle]
pub unsafe extern "C" fn C_GetMechanismInfo(
    slot: CK_SLOT_ID,
    kind: CK_MECHANISM_TYPE,
    info: *mut CK_MECHANISM_INFO,
) -> CK_RV {
    guard(|| {
        token::check_slot(slot)?;
        put(info, mechanism::info(kind)?)
    })
}

/// `C_OpenSession`.
#[no_mangle]
pub unsafe extern "C" fn C_OpenSession(
    slot: CK_SLOT_ID,
    flags: CK_FLAGS,
    _application: *mut c_void,
    _notify: CK_NOTIFY,
    session: *mut CK_SESSION_HANDLE,
) -> CK_RV {
    guard(|| {
        if session.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        put(session, token::open_session(slot, flags)?)
    })
}

/// `C_CloseSession`.
#[no_mangle]
pub unsafe extern "C" fn C_CloseSession(session: CK_SESSION_HANDLE) -> CK_RV {
    guard(|| token::close_session(session))
}

/// `C_CloseAllSessions`.
#[no_mangle]
pub unsafe extern "C" fn C_CloseAllSessions(slot: CK_SLOT_ID) -> CK_RV {
    guard(|| token::close_all_sessions(slot))
}

/// `C_GetSessionInfo`.
#[no_mangle]
pub unsafe extern "C" fn C_GetSessionInfo(session: CK_SESSION_HANDLE, info: *mut CK_SESSION_INFO) -> CK_RV {
    guard(|| {
        let (state, flags) = token::session_info(session)?;
        put(info, CK_SESSION_INFO { slotID: SLOT_ID, state, flags, ulDeviceError: 0 })
    })
}

/// `C_Login`.
#[no_mangle]
pub unsafe extern "C" fn C_Login(
    session: CK_SESSION_HANDLE,
    user: CK_USER_TYPE,
    pin: *mut CK_UTF8CHAR,
    pin_len: CK_ULONG,
) -> CK_RV {
    guard(|| {
        let pin = Zeroizing::new(input(pin, pin_len)?.to_vec());
        token::login(session, user, pin)
    })
}

/// `C_Logout`.
#[no_mangle]
pub unsafe extern "C" fn C_Logout(session: CK_SESSION_HANDLE) -> CK_RV {
    guard(|| token::logout(session))
}

/// `C_CreateObject`: certificates only (stored with their key).
#[no_mangle]
pub unsafe extern "C" fn C_CreateObject(
    session: CK_SESSION_HANDLE,
    attrs: *mut CK_ATTRIBUTE,
    count: CK_ULONG,
    object: *mut CK_OBJECT_HANDLE,
) -> CK_RV {
    guard(|| {
        if object.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let template = template(attrs, count)?;
        put(object, token::create_object(session, &template)?)
    })
}

/// `C_DestroyObject`.
#[no_mangle]
pub unsafe extern "C" fn C_DestroyObject(session: CK_SESSION_HANDLE, object: CK_OBJECT_HANDLE) -> CK_RV {
    guard(|| token::destroy_object(session, object))
}

/// `C_GetObjectSize`.
#[no_mangle]
pub unsafe extern "C" fn C_GetObjectSize(
    session: CK_SESSION_HANDLE,
    object: CK_OBJECT_HANDLE,
    size: *mut CK_ULONG,
) -> CK_RV {
    guard(|| {
        if size.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        put(size, token::object_size(session, object)? as CK_ULONG)
    })
}

/// `C_GetAttributeValue`: every attribute is answered; the return value is the last problem
/// met (unknown type, sensitive value, buffer too small), as PKCS#11 §5.7 requires.
#[no_mangle]
pub unsafe extern "C" fn C_GetAttributeValue(
    session: CK_SESSION_HANDLE,
    object: CK_OBJECT_HANDLE,
    attrs: *mut CK_ATTRIBUTE,
    count: CK_ULONG,
) -> CK_RV {
    guard(|| {
        if count == 0 {
            token::attributes(session, object, &[])?;
            return Ok(());
        }
        if attrs.is_null() || count > MAX_TEMPLATE {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let attrs = std::slice::from_raw_parts_mut(attrs, count as usize);
        let kinds: Vec<CK_ATTRIBUTE_TYPE> = attrs.iter().map(|a| a.type_).collect();
        let values = token::attributes(session, object, &kinds)?;
        let mut rv = CKR_OK;
        for (attr, value) in attrs.iter_mut().zip(values) {
            match value {
                None => {
                    attr.ulValueLen = CK_UNAVAILABLE_INFORMATION;
                    rv = CKR_ATTRIBUTE_TYPE_INVALID;
                }
                Some(Attr::Sensitive) => {
                    attr.ulValueLen = CK_UNAVAILABLE_INFORMATION;
                    rv = CKR_ATTRIBUTE_SENSITIVE;
                }
                Some(Attr::Value(v)) => {
                    if attr.pValue.is_null() {
                        attr.ulValueLen = v.len() as CK_ULONG;
                    } else if (attr.ulValueLen as usize) < v.len() {
                        attr.ulValueLen = CK_UNAVAILABLE_INFORMATION;
                        rv = CKR_BUFFER_TOO_SMALL;
                    } else {
                        std::ptr::copy_nonoverlapping(v.as_ptr(), attr.pValue as *mut u8, v.len());
                        attr.ulValueLen = v.len() as CK_ULONG;
                    }
                }
            }
        }
        if rv == CKR_OK {
            Ok(())
        } else {
            Err(rv)
        }
    })
}

/// `C_FindObjectsInit`.
#[no_mangle]
pub unsafe extern "C" fn C_FindObjectsInit(
    session: CK_SESSION_HANDLE,
    attrs: *mut CK_ATTRIBUTE,
    count: CK_ULONG,
) -> CK_RV {
    guard(|| {
        let template = template(attrs, count)?;
        token::find_init(session, &template)
    })
}

/// `C_FindObjects`.
#[no_mangle]
pub unsafe extern "C" fn C_FindObjects(
    session: CK_SESSION_HANDLE,
    objects: *mut CK_OBJECT_HANDLE,
    max: CK_ULONG,
    count: *mut CK_ULONG,
) -> CK_RV {
    guard(|| {
        if count.is_null() || (objects.is_null() && max > 0) {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let found = token::find(session, max as usize)?;
        if !found.is_empty() {
            std::ptr::copy_nonoverlapping(found.as_ptr(), objects, found.len());
        }
        put(count, found.len() as CK_ULONG)
    })
}

/// `C_FindObjectsFinal`.
#[no_mangle]
pub unsafe extern "C" fn C_FindObjectsFinal(session: CK_SESSION_HANDLE) -> CK_RV {
    guard(|| token::find_final(session))
}

/// `C_DigestInit`: SHA-256 and SHA-384, in-core.
#[no_mangle]
pub unsafe extern "C" fn C_DigestInit(session: CK_SESSION_HANDLE, mechanism: *mut CK_MECHANISM) -> CK_RV {
    guard(|| {
        let (kind, params) = mechanism_arg(mechanism)?;
        token::digest_init(session, kind, &params)
    })
}

/// `C_Digest`.
#[no_mangle]
pub unsafe extern "C" fn C_Digest(
    session: CK_SESSION_HANDLE,
    data: *mut CK_BYTE,
    data_len: CK_ULONG,
    digest: *mut CK_BYTE,
    digest_len: *mut CK_ULONG,
) -> CK_RV {
    guard(|| {
        let data = input(data, data_len)?;
        let out = token::digest(session, Some(data), capacity(digest, digest_len)?)?;
        output(out, digest, digest_len)
    })
}

/// `C_DigestUpdate`.
#[no_mangle]
pub unsafe extern "C" fn C_DigestUpdate(session: CK_SESSION_HANDLE, data: *mut CK_BYTE, len: CK_ULONG) -> CK_RV {
    guard(|| token::digest_update(session, input(data, len)?))
}

/// `C_DigestFinal`.
#[no_mangle]
pub unsafe extern "C" fn C_DigestFinal(session: CK_SESSION_HANDLE, digest: *mut CK_BYTE, len: *mut CK_ULONG) -> CK_RV {
    guard(|| {
        let out = token::digest(session, None, capacity(digest, len)?)?;
        output(out, digest, len)
    })
}

/// `C_SignInit`.
#[no_mangle]
pub unsafe extern "C" fn C_SignInit(
    session: CK_SESSION_HANDLE,
    mechanism: *mut CK_MECHANISM,
    key: CK_OBJECT_HANDLE,
) -> CK_RV {
    guard(|| {
        let (kind, params) = mechanism_arg(mechanism)?;
        token::operation_init(session, kind, &params, key, false)
    })
}

/// `C_Sign`.
#[no_mangle]
pub unsafe extern "C" fn C_Sign(
    session: CK_SESSION_HANDLE,
    data: *mut CK_BYTE,
    data_len: CK_ULONG,
    signature: *mut CK_BYTE,
    signature_len: *mut CK_ULONG,
) -> CK_RV {
    guard(|| {
        let data = input(data, data_len)?;
        let out = token::sign(session, Some(data), capacity(signature, signature_len)?)?;
        output(out, signature, signature_len)
    })
}

/// `C_SignUpdate`.
#[no_mangle]
pub unsafe extern "C" fn C_SignUpdate(session: CK_SESSION_HANDLE, data: *mut CK_BYTE, len: CK_ULONG) -> CK_RV {
    guard(|| token::operation_update(session, input(data, len)?, false))
}

/// `C_SignFinal`.
#[no_mangle]
pub unsafe extern "C" fn C_SignFinal(session: CK_SESSION_HANDLE, signature: *mut CK_BYTE, len: *mut CK_ULONG) -> CK_RV {
    guard(|| {
        let out = token::sign(session, None, capacity(signature, len)?)?;
        output(out, signature, len)
    })
}

/// `C_VerifyInit`.
#[no_mangle]
pub unsafe extern "C" fn C_VerifyInit(
    session: CK_SESSION_HANDLE,
    mechanism: *mut CK_MECHANISM,
    key: CK_OBJECT_HANDLE,
) -> CK_RV {
    guard(|| {
        let (kind, params) = mechanism_arg(mechanism)?;
        token::operation_init(session, kind, &params, key, true)
    })
}

/// `C_Verify`: in-core, with the public key.
#[no_mangle]
pub unsafe extern "C" fn C_Verify(
    session: CK_SESSION_HANDLE,
    data: *mut CK_BYTE,
    data_len: CK_ULONG,
    signature: *mut CK_BYTE,
    signature_len: CK_ULONG,
) -> CK_RV {
    guard(|| {
        let data = input(data, data_len)?;
        token::verify(session, Some(data), input(signature, signature_len)?)
    })
}

/// `C_VerifyUpdate`.
#[no_mangle]
pub unsafe extern "C" fn C_VerifyUpdate(session: CK_SESSION_HANDLE, data: *mut CK_BYTE, len: CK_ULONG) -> CK_RV {
    guard(|| token::operation_update(session, input(data, len)?, true))
}

/// `C_VerifyFinal`.
#[no_mangle]
pub unsafe extern "C" fn C_VerifyFinal(session: CK_SESSION_HANDLE, signature: *mut CK_BYTE, len: CK_ULONG) -> CK_RV {
    guard(|| token::verify(session, None, input(signature, len)?))
}

/// `C_GenerateKeyPair`: a new vault key, named by `CKA_LABEL`.
#[no_mangle]
pub unsafe extern "C" fn C_GenerateKeyPair(
    session: CK_SESSION_HANDLE,
    mechanism: *mut CK_MECHANISM,
    public_attrs: *mut CK_ATTRIBUTE,
    public_count: CK_ULONG,
    private_attrs: *mut CK_ATTRIBUTE,
    private_count: CK_ULONG,
    public_key: *mut CK_OBJECT_HANDLE,
    private_key: *mut CK_OBJECT_HANDLE,
) -> CK_RV {
    guard(|| {
        if public_key.is_null() || private_key.is_null() {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let (kind, _params) = mechanism_arg(mechanism)?;
        let public = template(public_attrs, public_count)?;
        let private = template(private_attrs, private_count)?;
        let (public_handle, private_handle) = token::generate_key_pair(session, kind, &public, &private)?;
        put(public_key, public_handle)?;
        put(private_key, private_handle)
    })
}

/// `C_GenerateRandom`: from the daemon's DRBG.
#[no_mangle]
pub unsafe extern "C" fn C_GenerateRandom(session: CK_SESSION_HANDLE, data: *mut CK_BYTE, len: CK_ULONG) -> CK_RV {
    guard(|| {
        if data.is_null() && len > 0 {
            return Err(CKR_ARGUMENTS_BAD);
        }
        let bytes = token::random(session, len as usize)?;
        if !bytes.is_empty() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len());
        }
        Ok(())
    })
}

/// `C_SeedRandom`: the daemon's DRBG takes no seed from clients.
#[no_mangle]
pub unsafe extern "C" fn C_SeedRandom(session: CK_SESSION_HANDLE, _seed: *mut CK_BYTE, _len: CK_ULONG) -> CK_RV {
    guard(|| {
        token::session_info(session)?;
        Err(CKR_RANDOM_SEED_NOT_SUPPORTED)
    })
}

/// Defines entry points the token does not offer; each returns `rv` (once the module is
/// initialized).
macro_rules! refused {
    ($rv:expr => $($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not offered (`", stringify!($rv), "`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CK_RV {
            $(let _ = $arg;)*
            guard(|| {
                token::config()?;
                Err($rv)
            })
        }
    )*};
}

refused! { CKR_FUNCTION_NOT_SUPPORTED =>
    C_InitToken(a: CK_SLOT_ID, b: *mut CK_UTF8CHAR, c: CK_ULONG, d: *mut CK_UTF8CHAR);
    C_InitPIN(a: CK_SESSION_HANDLE, b: *mut CK_UTF8CHAR, c: CK_ULONG);
    C_SetPIN(a: CK_SESSION_HANDLE, b: *mut CK_UTF8CHAR, c: CK_ULONG, d: *mut CK_UTF8CHAR, e: CK_ULONG);
    C_GetOperationState(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: *mut CK_ULONG);
    C_SetOperationState(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: CK_OBJECT_HANDLE, e: CK_OBJECT_HANDLE);
    C_EncryptInit(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE);
    C_Encrypt(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_EncryptUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_EncryptFinal(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: *mut CK_ULONG);
    C_DecryptInit(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE);
    C_Decrypt(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_DecryptUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_DecryptFinal(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: *mut CK_ULONG);
    C_DigestKey(a: CK_SESSION_HANDLE, b: CK_OBJECT_HANDLE);
    C_SignRecoverInit(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE);
    C_SignRecover(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_VerifyRecoverInit(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE);
    C_VerifyRecover(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_DigestEncryptUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_DecryptDigestUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_SignEncryptUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_DecryptVerifyUpdate(a: CK_SESSION_HANDLE, b: *mut CK_BYTE, c: CK_ULONG, d: *mut CK_BYTE, e: *mut CK_ULONG);
    C_GenerateKey(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: *mut CK_ATTRIBUTE, d: CK_ULONG, e: *mut CK_OBJECT_HANDLE);
    C_WrapKey(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE, d: CK_OBJECT_HANDLE, e: *mut CK_BYTE, f: *mut CK_ULONG);
    C_UnwrapKey(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE, d: *mut CK_BYTE, e: CK_ULONG, f: *mut CK_ATTRIBUTE, g: CK_ULONG, h: *mut CK_OBJECT_HANDLE);
    C_DeriveKey(a: CK_SESSION_HANDLE, b: *mut CK_MECHANISM, c: CK_OBJECT_HANDLE, d: *mut CK_ATTRIBUTE, e: CK_ULONG, f: *mut CK_OBJECT_HANDLE);
    C_WaitForSlotEvent(a: CK_FLAGS, b: *mut CK_SLOT_ID, c: *mut c_void);
}

refused! { CKR_ACTION_PROHIBITED =>
    C_CopyObject(a: CK_SESSION_HANDLE, b: CK_OBJECT_HANDLE, c: *mut CK_ATTRIBUTE, d: CK_ULONG, e: *mut CK_OBJECT_HANDLE);
    C_SetAttributeValue(a: CK_SESSION_HANDLE, b: CK_OBJECT_HANDLE, c: *mut CK_ATTRIBUTE, d: CK_ULONG);
}

refused! { CKR_FUNCTION_NOT_PARALLEL =>
    C_GetFunctionStatus(a: CK_SESSION_HANDLE);
    C_CancelFunction(a: CK_SESSION_HANDLE);
}
