//! ML-DSA through the module's C ABI, in-process: no installed tool signs ML-DSA
//! (pkcs11-tool 0.23 signs into a fixed buffer far shorter than an ML-DSA-65 signature and
//! fails with CKR_BUFFER_TOO_SMALL; OpenSSL 3.0 and GnuTLS 3.7 have no ML-DSA). The test takes
//! the function list from `C_GetFunctionList` like any application, signs with CKM_ML_DSA
//! using the two-call length convention, has the vault verify the signature (`tpm-vault
//! verify`), and checks the module's own C_Verify accepts it and rejects an altered one.
//!
//! One test in this binary: the module reads `TPM_VAULT_SOCKET` at the first C_Initialize of
//! the process.
#![allow(unsafe_code)]

mod support;

use std::ptr;

use cryptoki_sys::*;
use support::{describe, run, stdout, Daemon};

/// Panics unless `rv` is CKR_OK.
fn ok(rv: CK_RV, what: &str) {
    assert_eq!(rv, CKR_OK, "{what} returned {rv:#x}");
}

/// The one object of `class` labelled `label`.
fn find(f: &CK_FUNCTION_LIST, session: CK_SESSION_HANDLE, class: CK_OBJECT_CLASS, label: &str) -> CK_OBJECT_HANDLE {
    let mut class = class;
    let mut label = label.as_bytes().to_vec();
    let mut template = [
        CK_ATTRIBUTE {
            type_: CKA_CLASS,
            pValue: ptr::addr_of_mut!(class).cast(),
            ulValueLen: std::mem::size_of::<CK_OBJECT_CLASS>() as CK_ULONG,
        },
        CK_ATTRIBUTE { type_: CKA_LABEL, pValue: label.as_mut_ptr().cast(), ulValueLen: label.len() as CK_ULONG },
    ];
    let mut handles = [0 as CK_OBJECT_HANDLE; 4];
    let mut count: CK_ULONG = 0;
    // SAFETY: the template and output buffers outlive the calls; lengths match the buffers.
    unsafe {
        ok(f.C_FindObjectsInit.expect("C_FindObjectsInit")(session, template.as_mut_ptr(), 2), "C_FindObjectsInit");
        ok(f.C_FindObjects.expect("C_FindObjects")(session, handles.as_mut_ptr(), 4, &mut count), "C_FindObjects");
        ok(f.C_FindObjectsFinal.expect("C_FindObjectsFinal")(session), "C_FindObjectsFinal");
    }
    assert_eq!(count, 1, "objects of class {class:#x} labelled {label:?}");
    handles[0]
}

#[test]
fn ml_dsa_65_signs_through_the_c_abi_and_the_vault_verifies() {
    let d = Daemon::start();
    d.create_key("mldsa", "ml-dsa-65");
    std::env::set_var("TPM_VAULT_SOCKET", &d.socket);
    std::env::set_var("TPM_VAULT_PKCS11_TOKEN_LABEL", support::TOKEN_LABEL);
    let config = d.path().join("pkcs11.toml");
    std::fs::write(&config, "").expect("pkcs11.toml");
    std::env::set_var("TPM_VAULT_PKCS11_CONFIG", &config);

    let message = b"message signed with ML-DSA-65 through PKCS#11".to_vec();
    let mut list: *mut CK_FUNCTION_LIST = ptr::null_mut();
    // SAFETY: PKCS#11 calls with valid pointers to live locals; buffer lengths are passed
    // with the buffers; the function list is static in the module.
    let (signature, verify_ok, verify_bad) = unsafe {
        ok(tpm_vault_pkcs11::entry::C_GetFunctionList(&mut list), "C_GetFunctionList");
        let f = &*list;
        ok(f.C_Initialize.expect("C_Initialize")(ptr::null_mut()), "C_Initialize");
        let mut session: CK_SESSION_HANDLE = 0;
        ok(
            f.C_OpenSession.expect("C_OpenSession")(1, CKF_SERIAL_SESSION, ptr::null_mut(), None, &mut session),
            "C_OpenSession",
        );
        let private = find(f, session, CKO_PRIVATE_KEY, "mldsa");
        let public = find(f, session, CKO_PUBLIC_KEY, "mldsa");

        let mut mechanism = CK_MECHANISM { mechanism: CKM_ML_DSA, pParameter: ptr::null_mut(), ulParameterLen: 0 };
        ok(f.C_SignInit.expect("C_SignInit")(session, &mut mechanism, private), "C_SignInit");
        let mut data = message.clone();
        let mut len: CK_ULONG = 0;
        let sign = f.C_Sign.expect("C_Sign");
        ok(sign(session, data.as_mut_ptr(), data.len() as CK_ULONG, ptr::null_mut(), &mut len), "C_Sign(NULL)");
        assert_eq!(len, 3309, "C_Sign(NULL) length for ML-DSA-65");
        let mut signature = vec![0u8; len as usize];
        ok(sign(session, data.as_mut_ptr(), data.len() as CK_ULONG, signature.as_mut_ptr(), &mut len), "C_Sign");
        signature.truncate(len as usize);

        let mut verify = |sig: &mut Vec<u8>| {
            let mut data = message.clone();
            ok(f.C_VerifyInit.expect("C_VerifyInit")(session, &mut mechanism, public), "C_VerifyInit");
            f.C_Verify.expect("C_Verify")(
                session,
                data.as_mut_ptr(),
                data.len() as CK_ULONG,
                sig.as_mut_ptr(),
                sig.len() as CK_ULONG,
            )
        };
        let verify_ok = verify(&mut signature.clone());
        let mut bad = signature.clone();
        bad[100] ^= 1;
        let verify_bad = verify(&mut bad);
        ok(f.C_CloseSession.expect("C_CloseSession")(session), "C_CloseSession");
        ok(f.C_Finalize.expect("C_Finalize")(ptr::null_mut()), "C_Finalize");
        (signature, verify_ok, verify_bad)
    };
    assert_eq!(signature.len(), 3309, "ML-DSA-65 signature length");
    assert_eq!(verify_ok, CKR_OK, "the module's C_Verify rejects its own signature");
    assert_eq!(verify_bad, CKR_SIGNATURE_INVALID, "the module's C_Verify on an altered signature");

    let data = d.path().join("message");
    std::fs::write(&data, &message).expect("message");
    let sig = d.path().join("message.sig");
    std::fs::write(&sig, &signature).expect("signature");
    let out = run(d.cli().args(["verify", "mldsa", "--in"]).arg(&data).arg("--sig").arg(&sig));
    assert!(out.status.success() && stdout(&out).contains("Verified OK"), "tpm-vault verify: {}", describe(&out));
}
