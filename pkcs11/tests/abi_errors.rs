//! The C ABI's error codes, called in this process: every documented code for bad
//! arguments, wrong state and wrong keys, the two-call convention, a password key's
//! context-specific login; then thousands of calls with garbage (null pointers, short buffers,
//! random attribute templates, random handles, random mechanisms) that must each return a
//! PKCS#11 code, never panic (`CKR_GENERAL_ERROR` is what a caught panic returns) or crash,
//! after which the module still signs. One test function: the module's state is per process.

#![allow(unsafe_code)]

mod p11;
mod support;

use std::ptr;

use cryptoki_sys::*;
use p11::{ck, Module};
use rand::{Rng, SeedableRng};

/// `C_SignInit` with a mechanism and parameters.
fn sign_init<T>(
    m: &Module,
    s: CK_SESSION_HANDLE,
    mechanism: CK_MECHANISM_TYPE,
    params: Option<&mut T>,
    key: CK_OBJECT_HANDLE,
) -> Result<(), CK_RV> {
    let (p, len) = match params {
        Some(p) => (p as *mut T as *mut std::ffi::c_void, std::mem::size_of::<T>() as CK_ULONG),
        None => (ptr::null_mut(), 0),
    };
    let mut mech = CK_MECHANISM { mechanism, pParameter: p, ulParameterLen: len };
    // SAFETY: the mechanism and its parameters live for the call.
    ck(unsafe { (m.f.C_SignInit.expect("C_SignInit"))(s, &mut mech, key) })
}

/// `C_Sign` into a buffer of `room` bytes (`None`: a null buffer); returns the length set.
fn sign_into(m: &Module, s: CK_SESSION_HANDLE, data: &[u8], room: Option<usize>) -> (CK_RV, CK_ULONG, Vec<u8>) {
    let mut out = vec![0u8; room.unwrap_or(0)];
    let mut len = room.unwrap_or(0) as CK_ULONG;
    let p = if room.is_some() { out.as_mut_ptr() } else { ptr::null_mut() };
    // SAFETY: `out` holds `len` bytes.
    let rv = unsafe { (m.f.C_Sign.expect("C_Sign"))(s, data.as_ptr() as *mut _, data.len() as CK_ULONG, p, &mut len) };
    (rv, len, out)
}

#[test]
fn error_codes_and_garbage() {
    let daemon = support::Daemon::start();
    daemon.create_key("ec", "ecc-p256");
    daemon.create_key("rsa", "rsa-2048");
    let auth = daemon.path().join("pw");
    std::fs::write(&auth, "s3cret\n").expect("password file");
    support::run_ok(daemon.cli().args(["key", "create", "guarded", "--auth-file"]).arg(&auth));
    let m = Module::load(&daemon);

    // Before C_Initialize.
    assert_eq!(m.open_session(), Err(CKR_CRYPTOKI_NOT_INITIALIZED));
    let mut args = CK_C_INITIALIZE_ARGS {
        CreateMutex: None,
        DestroyMutex: None,
        LockMutex: None,
        UnlockMutex: None,
        flags: 0,
        pReserved: ptr::dangling_mut(),
    };
    // SAFETY: a valid CK_C_INITIALIZE_ARGS.
    assert_eq!(unsafe { (m.f.C_Initialize.expect("init"))(&mut args as *mut _ as *mut _) }, CKR_ARGUMENTS_BAD);
    args.pReserved = ptr::null_mut();
    args.flags = CKF_OS_LOCKING_OK;
    // SAFETY: as above.
    assert_eq!(unsafe { (m.f.C_Initialize.expect("init"))(&mut args as *mut _ as *mut _) }, CKR_OK);
    assert_eq!(m.initialize(), Err(CKR_CRYPTOKI_ALREADY_INITIALIZED));

    // Slots, sessions, handles.
    let mut count: CK_ULONG = 0;
    // SAFETY: valid out-pointers (or null where the test says so).
    unsafe {
        assert_eq!((m.f.C_GetSlotList.expect("slots"))(1, ptr::null_mut(), ptr::null_mut()), CKR_ARGUMENTS_BAD);
        assert_eq!((m.f.C_GetSlotList.expect("slots"))(1, ptr::null_mut(), &mut count), CKR_OK);
        assert_eq!(count, 1);
        let mut slot = [0 as CK_SLOT_ID; 1];
        count = 0;
        assert_eq!((m.f.C_GetSlotList.expect("slots"))(1, slot.as_mut_ptr(), &mut count), CKR_BUFFER_TOO_SMALL);
        assert_eq!(count, 1);
        let mut info: CK_TOKEN_INFO = std::mem::zeroed();
        assert_eq!((m.f.C_GetTokenInfo.expect("token"))(7, &mut info), CKR_SLOT_ID_INVALID);
        let mut s = 0;
        assert_eq!(
            (m.f.C_OpenSession.expect("open"))(1, 0, ptr::null_mut(), None, &mut s),
            CKR_SESSION_PARALLEL_NOT_SUPPORTED
        );
    }
    let s = m.open_session().expect("session");
    assert_eq!(m.close_session(s + 1000), Err(CKR_SESSION_HANDLE_INVALID));
    let ec = m.find_one(s, CKO_PRIVATE_KEY, "ec").expect("ec");
    let ec_pub = m.find_one(s, CKO_PUBLIC_KEY, "ec").expect("ec public");
    let rsa = m.find_one(s, CKO_PRIVATE_KEY, "rsa").expect("rsa");
    let guarded = m.find_one(s, CKO_PRIVATE_KEY, "guarded").expect("guarded");
    assert_eq!(m.attr(s, 0x1234_5678, CKA_LABEL), Err(CKR_OBJECT_HANDLE_INVALID));
    assert_eq!(m.attr(s, ec, CKA_LABEL).as_deref(), Ok(&b"ec"[..]));
    assert_eq!(m.attr(s, ec, CKA_ID), m.attr(s, ec_pub, CKA_ID), "one CKA_ID for the key's objects");
    assert_eq!(m.attr(s, ec, CKA_VALUE), Err(CKR_ATTRIBUTE_SENSITIVE));
    assert_eq!(m.attr(s, ec, 0x7fff_0000), Err(CKR_ATTRIBUTE_TYPE_INVALID));
    assert_eq!(m.attr(s, guarded, CKA_ALWAYS_AUTHENTICATE), Ok(vec![CK_TRUE]));
    assert_eq!(m.attr(s, ec, CKA_EXTRACTABLE), Ok(vec![CK_FALSE]));
    // Several attributes at once: each answered, the problem reported, a short buffer too.
    {
        let mut label = [0u8; 1];
        let mut attrs = [
            CK_ATTRIBUTE { type_: CKA_VALUE, pValue: ptr::null_mut(), ulValueLen: 0 },
            CK_ATTRIBUTE { type_: CKA_LABEL, pValue: label.as_mut_ptr() as *mut _, ulValueLen: 1 },
            CK_ATTRIBUTE { type_: CKA_KEY_TYPE, pValue: ptr::null_mut(), ulValueLen: 0 },
        ];
        // SAFETY: buffers of the declared sizes.
        let rv = unsafe { (m.f.C_GetAttributeValue.expect("get"))(s, ec, attrs.as_mut_ptr(), 3) };
        assert!(rv == CKR_ATTRIBUTE_SENSITIVE || rv == CKR_BUFFER_TOO_SMALL, "{rv:#x}");
        assert_eq!(attrs[0].ulValueLen, CK_UNAVAILABLE_INFORMATION);
        assert_eq!(attrs[1].ulValueLen, CK_UNAVAILABLE_INFORMATION);
        assert_eq!(attrs[2].ulValueLen, std::mem::size_of::<CK_ULONG>() as CK_ULONG);
    }

    // Signing: state, keys, mechanisms, lengths.
    let digest = [7u8; 32];
    assert_eq!(sign_into(&m, s, &digest, Some(64)).0, CKR_OPERATION_NOT_INITIALIZED, "no C_SignInit");
    assert_eq!(sign_init::<()>(&m, s, CKM_ECDSA, None, 0x4242), Err(CKR_KEY_HANDLE_INVALID));
    assert_eq!(sign_init::<()>(&m, s, CKM_RSA_PKCS, None, ec), Err(CKR_KEY_TYPE_INCONSISTENT));
    assert_eq!(sign_init::<()>(&m, s, CKM_AES_CBC, None, ec), Err(CKR_MECHANISM_INVALID));
    assert_eq!(sign_init::<()>(&m, s, CKM_ECDSA, None, ec_pub), Err(CKR_KEY_FUNCTION_NOT_PERMITTED));
    sign_init::<()>(&m, s, CKM_ECDSA, None, ec).expect("init");
    assert_eq!(sign_init::<()>(&m, s, CKM_ECDSA, None, ec), Err(CKR_OPERATION_ACTIVE));
    let (rv, len, _) = sign_into(&m, s, &digest, Some(10));
    assert_eq!((rv, len), (CKR_BUFFER_TOO_SMALL, 64), "too small: the length, and the operation stays");
    let (rv, len, _) = sign_into(&m, s, &digest, None);
    assert_eq!((rv, len), (CKR_OK, 64), "null buffer: the length");
    let (rv, len, sig) = sign_into(&m, s, &digest, Some(64));
    assert_eq!((rv, len), (CKR_OK, 64));
    assert_ne!(sig, vec![0u8; 64]);
    assert_eq!(sign_into(&m, s, &digest, Some(64)).0, CKR_OPERATION_NOT_INITIALIZED, "the signature ended it");
    // PSS: a salt the TPM cannot make; a digest of the wrong length.
    let mut pss = CK_RSA_PKCS_PSS_PARAMS { hashAlg: CKM_SHA256, mgf: CKG_MGF1_SHA256, sLen: 20 };
    assert_eq!(sign_init(&m, s, CKM_RSA_PKCS_PSS, Some(&mut pss), rsa), Err(CKR_MECHANISM_PARAM_INVALID));
    pss.sLen = 32;
    sign_init(&m, s, CKM_RSA_PKCS_PSS, Some(&mut pss), rsa).expect("PSS init");
    assert_eq!(sign_into(&m, s, &[1u8; 20], Some(256)).0, CKR_DATA_LEN_RANGE);
    sign_init::<()>(&m, s, CKM_RSA_PKCS, None, rsa).expect("PKCS#1 init");
    assert_eq!(sign_into(&m, s, b"not a DigestInfo", Some(256)).0, CKR_DATA_INVALID);

    // A password key: no signature before the context-specific login; a wrong password is
    // CKR_PIN_INCORRECT (one try: swtpm locks out after three); the right one signs.
    sign_init::<()>(&m, s, CKM_ECDSA, None, guarded).expect("init");
    assert_eq!(sign_into(&m, s, &digest, Some(64)).0, CKR_USER_NOT_LOGGED_IN);
    let login = |pin: &[u8]| {
        // SAFETY: the pin buffer lives for the call.
        unsafe { (m.f.C_Login.expect("login"))(s, CKU_CONTEXT_SPECIFIC, pin.as_ptr() as *mut _, pin.len() as CK_ULONG) }
    };
    assert_eq!(login(b"wrong"), CKR_OK);
    assert_eq!(sign_into(&m, s, &digest, Some(64)).0, CKR_PIN_INCORRECT);
    sign_init::<()>(&m, s, CKM_ECDSA, None, guarded).expect("init");
    assert_eq!(login(b"s3cret"), CKR_OK);
    assert_eq!(sign_into(&m, s, &digest, Some(64)).0, CKR_OK);

    // Garbage: random calls with random handles, mechanisms, templates, null pointers and
    // short buffers. Every call must return, with a PKCS#11 code other than the one a caught
    // panic gives.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e57);
    let objects = [ec, ec_pub, rsa, guarded, 0, 1, u64::MAX as CK_OBJECT_HANDLE];
    let sessions = [s, 0, 999_999];
    let kinds =
        [CKA_CLASS, CKA_LABEL, CKA_ID, CKA_VALUE, CKA_KEY_TYPE, CKA_EC_PARAMS, CKA_MODULUS, CKA_SIGN, 0x8000_0001];
    let mechanisms = [
        CKM_ECDSA,
        CKM_ECDSA_SHA256,
        CKM_RSA_PKCS,
        CKM_RSA_PKCS_PSS,
        CKM_SHA256,
        CKM_ML_DSA,
        CKM_EC_KEY_PAIR_GEN,
        0xdead,
    ];
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..3000 {
        let session = sessions[rng.gen_range(0..sessions.len())];
        let object = if rng.gen_bool(0.8) { objects[rng.gen_range(0..objects.len())] } else { rng.gen() };
        let mut values: Vec<Vec<u8>> =
            (0..rng.gen_range(0..6)).map(|_| (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect()).collect();
        let mut template: Vec<CK_ATTRIBUTE> = values
            .iter_mut()
            .map(|v| CK_ATTRIBUTE {
                type_: kinds[rng.gen_range(0..kinds.len())],
                pValue: if v.is_empty() && rng.gen_bool(0.5) { ptr::null_mut() } else { v.as_mut_ptr() as *mut _ },
                ulValueLen: v.len() as CK_ULONG,
            })
            .collect();
        let template_ptr =
            if template.is_empty() && rng.gen_bool(0.5) { ptr::null_mut() } else { template.as_mut_ptr() };
        let mut buf = vec![0u8; rng.gen_range(0..300)];
        let mut len = buf.len() as CK_ULONG;
        let buf_ptr = if rng.gen_bool(0.2) { ptr::null_mut() } else { buf.as_mut_ptr() };
        let data: Vec<u8> = (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect();
        let mut params = [0u8; 24];
        rng.fill(&mut params[..]);
        let mut mech = CK_MECHANISM {
            mechanism: mechanisms[rng.gen_range(0..mechanisms.len())],
            pParameter: if rng.gen_bool(0.5) { ptr::null_mut() } else { params.as_mut_ptr() as *mut _ },
            ulParameterLen: [0, 8, 24][rng.gen_range(0..3)],
        };
        let mech_ptr: *mut CK_MECHANISM = if rng.gen_bool(0.1) { ptr::null_mut() } else { &mut mech };
        let mut handle: CK_OBJECT_HANDLE = 0;
        let mut handle2: CK_OBJECT_HANDLE = 0;
        let mut found = [0 as CK_OBJECT_HANDLE; 3];
        let tlen = template.len() as CK_ULONG;
        // SAFETY: every non-null pointer points to a buffer of the size passed with it.
        let rv = unsafe {
            match rng.gen_range(0..14) {
                0 => (m.f.C_GetAttributeValue.expect("f"))(session, object, template_ptr, tlen),
                1 => (m.f.C_FindObjectsInit.expect("f"))(session, template_ptr, tlen),
                2 => (m.f.C_FindObjects.expect("f"))(session, found.as_mut_ptr(), 3, &mut len),
                3 => (m.f.C_FindObjectsFinal.expect("f"))(session),
                4 => (m.f.C_SignInit.expect("f"))(session, mech_ptr, object),
                5 => (m.f.C_Sign.expect("f"))(
                    session,
                    data.as_ptr() as *mut _,
                    data.len() as CK_ULONG,
                    buf_ptr,
                    &mut len,
                ),
                6 => (m.f.C_SignUpdate.expect("f"))(session, data.as_ptr() as *mut _, data.len() as CK_ULONG),
                7 => (m.f.C_SignFinal.expect("f"))(session, buf_ptr, &mut len),
                8 => (m.f.C_VerifyInit.expect("f"))(session, mech_ptr, object),
                9 => (m.f.C_Verify.expect("f"))(
                    session,
                    data.as_ptr() as *mut _,
                    data.len() as CK_ULONG,
                    buf.as_mut_ptr(),
                    buf.len() as CK_ULONG,
                ),
                10 => (m.f.C_DigestInit.expect("f"))(session, mech_ptr),
                11 => (m.f.C_Digest.expect("f"))(
                    session,
                    data.as_ptr() as *mut _,
                    data.len() as CK_ULONG,
                    buf_ptr,
                    &mut len,
                ),
                12 => (m.f.C_CreateObject.expect("f"))(session, template_ptr, tlen, &mut handle),
                _ => (m.f.C_GenerateKeyPair.expect("f"))(
                    session,
                    mech_ptr,
                    template_ptr,
                    tlen,
                    template_ptr,
                    tlen,
                    &mut handle,
                    &mut handle2,
                ),
            }
        };
        assert_ne!(rv, CKR_GENERAL_ERROR, "a call panicked inside the module");
        *codes.entry(rv).or_insert(0u32) += 1;
    }
    assert!(codes.len() > 8, "the garbage reached many distinct checks: {codes:x?}");
    // Garbage never made a key (random templates have no valid label with a valid curve).
    let names = daemon.key_names();
    assert_eq!(names, ["ec", "guarded", "rsa"], "{names:?}");
    // And the module still works: a fresh session signs.
    let s2 = m.open_session().expect("session after garbage");
    sign_init::<()>(&m, s2, CKM_ECDSA, None, ec).expect("init");
    assert_eq!(sign_into(&m, s2, &digest, Some(64)).0, CKR_OK);
    m.finalize().expect("C_Finalize");
}
