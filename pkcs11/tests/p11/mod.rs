//! A small safe wrapper over the module's function list, for the tests that drive the C ABI
//! in their own process (the crate's rlib: the same entry points the `.so` exports).
#![allow(dead_code)]

use std::ptr;

use cryptoki_sys::*;

/// The module's function list.
#[derive(Clone, Copy)]
pub struct Module {
    /// From `C_GetFunctionList`.
    pub f: &'static CK_FUNCTION_LIST,
}

/// `Ok` for `CKR_OK`, the code otherwise.
pub fn ck(rv: CK_RV) -> Result<(), CK_RV> {
    if rv == CKR_OK {
        Ok(())
    } else {
        Err(rv)
    }
}

/// A `CK_ULONG` attribute value.
pub fn ulong(v: CK_ULONG) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

impl Module {
    /// The function list, with this process pointed at `daemon` (environment set before
    /// `C_Initialize`, as a program's environment would be).
    pub fn load(daemon: &crate::support::Daemon) -> Module {
        let config = daemon.path().join("pkcs11.toml");
        std::fs::write(&config, "").expect("pkcs11.toml");
        std::env::set_var("TPM_VAULT_SOCKET", &daemon.socket);
        std::env::set_var("TPM_VAULT_PKCS11_CONFIG", &config);
        let mut list: *mut CK_FUNCTION_LIST = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        ck(unsafe { tpm_vault_pkcs11::entry::C_GetFunctionList(&mut list) }).expect("C_GetFunctionList");
        // SAFETY: the module returns a pointer to its static function list.
        Module { f: unsafe { &*list } }
    }

    /// `C_Initialize(NULL)`.
    pub fn initialize(&self) -> Result<(), CK_RV> {
        // SAFETY: null arguments are allowed.
        ck(unsafe { (self.f.C_Initialize.expect("C_Initialize"))(ptr::null_mut()) })
    }

    /// `C_Finalize(NULL)`.
    pub fn finalize(&self) -> Result<(), CK_RV> {
        // SAFETY: as above.
        ck(unsafe { (self.f.C_Finalize.expect("C_Finalize"))(ptr::null_mut()) })
    }

    /// A read-write session on slot 1.
    pub fn open_session(&self) -> Result<CK_SESSION_HANDLE, CK_RV> {
        let mut session = 0;
        // SAFETY: a valid out-pointer.
        ck(unsafe {
            (self.f.C_OpenSession.expect("C_OpenSession"))(
                1,
                CKF_SERIAL_SESSION | CKF_RW_SESSION,
                ptr::null_mut(),
                None,
                &mut session,
            )
        })?;
        Ok(session)
    }

    /// `C_CloseSession`.
    pub fn close_session(&self, session: CK_SESSION_HANDLE) -> Result<(), CK_RV> {
        // SAFETY: plain values.
        ck(unsafe { (self.f.C_CloseSession.expect("C_CloseSession"))(session) })
    }

    /// Every object matching `template`.
    pub fn find(
        &self,
        session: CK_SESSION_HANDLE,
        template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)],
    ) -> Result<Vec<CK_OBJECT_HANDLE>, CK_RV> {
        let mut attrs: Vec<CK_ATTRIBUTE> = template
            .iter()
            .map(|(t, v)| CK_ATTRIBUTE { type_: *t, pValue: v.as_ptr() as *mut _, ulValueLen: v.len() as CK_ULONG })
            .collect();
        // SAFETY: the template points into `template`, alive for the call.
        ck(unsafe { (self.f.C_FindObjectsInit.expect("init"))(session, attrs.as_mut_ptr(), attrs.len() as CK_ULONG) })?;
        let mut found = Vec::new();
        loop {
            let mut batch = [0 as CK_OBJECT_HANDLE; 4];
            let mut n = 0;
            // SAFETY: the buffer holds 4 handles.
            ck(unsafe { (self.f.C_FindObjects.expect("find"))(session, batch.as_mut_ptr(), 4, &mut n) })?;
            if n == 0 {
                break;
            }
            found.extend_from_slice(&batch[..n as usize]);
        }
        // SAFETY: plain values.
        ck(unsafe { (self.f.C_FindObjectsFinal.expect("final"))(session) })?;
        Ok(found)
    }

    /// The one object of `class` labelled `label`.
    pub fn find_one(
        &self,
        session: CK_SESSION_HANDLE,
        class: CK_OBJECT_CLASS,
        label: &str,
    ) -> Result<CK_OBJECT_HANDLE, CK_RV> {
        let found = self.find(session, &[(CKA_CLASS, ulong(class)), (CKA_LABEL, label.as_bytes().to_vec())])?;
        assert_eq!(found.len(), 1, "objects of class {class} labelled {label}: {found:?}");
        Ok(found[0])
    }

    /// `C_SignInit` + `C_Sign` with the two-call convention (length first).
    pub fn sign(
        &self,
        session: CK_SESSION_HANDLE,
        mechanism: CK_MECHANISM_TYPE,
        key: CK_OBJECT_HANDLE,
        data: &[u8],
    ) -> Result<Vec<u8>, CK_RV> {
        let mut mech = CK_MECHANISM { mechanism, pParameter: ptr::null_mut(), ulParameterLen: 0 };
        // SAFETY: the mechanism lives for the call.
        ck(unsafe { (self.f.C_SignInit.expect("C_SignInit"))(session, &mut mech, key) })?;
        let mut len = 0;
        // SAFETY: a null output asks for the length.
        ck(unsafe {
            (self.f.C_Sign.expect("C_Sign"))(
                session,
                data.as_ptr() as *mut _,
                data.len() as CK_ULONG,
                ptr::null_mut(),
                &mut len,
            )
        })?;
        let mut out = vec![0u8; len as usize];
        // SAFETY: `out` holds `len` bytes.
        ck(unsafe {
            (self.f.C_Sign.expect("C_Sign"))(
                session,
                data.as_ptr() as *mut _,
                data.len() as CK_ULONG,
                out.as_mut_ptr(),
                &mut len,
            )
        })?;
        out.truncate(len as usize);
        Ok(out)
    }

    /// One attribute's value.
    pub fn attr(
        &self,
        session: CK_SESSION_HANDLE,
        object: CK_OBJECT_HANDLE,
        kind: CK_ATTRIBUTE_TYPE,
    ) -> Result<Vec<u8>, CK_RV> {
        let mut attr = CK_ATTRIBUTE { type_: kind, pValue: ptr::null_mut(), ulValueLen: 0 };
        // SAFETY: one attribute, null value: the length.
        ck(unsafe { (self.f.C_GetAttributeValue.expect("get"))(session, object, &mut attr, 1) })?;
        let mut value = vec![0u8; attr.ulValueLen as usize];
        attr.pValue = value.as_mut_ptr() as *mut _;
        // SAFETY: `value` holds the length the module gave.
        ck(unsafe { (self.f.C_GetAttributeValue.expect("get"))(session, object, &mut attr, 1) })?;
        value.truncate(attr.ulValueLen as usize);
        Ok(value)
    }
}

/// Runs `body` in a forked child; returns its pid, exit code and message (sent on a pipe).
pub fn in_child(body: impl FnOnce() -> Result<(), String>) -> (i32, i32, String) {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the child runs `body` (module calls and plain system calls; the module's locks are
    // consistent through its atfork hooks) and leaves with `_exit`, never returning or unwinding.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
            .unwrap_or_else(|_| Err("the child panicked".into()));
        let (code, message) = match result {
            Ok(()) => (0, String::new()),
            Err(m) => (1, m),
        };
        // SAFETY: writes the message to the pipe's write end, then exits without unwinding.
        unsafe {
            libc::write(fds[1], message.as_ptr().cast(), message.len());
            libc::_exit(code);
        }
    }
    // SAFETY: the parent's copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid, "waitpid");
    let mut message = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: reads into `buf`.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        message.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fds[0]) };
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    (pid, code, format!("child {pid}: {}", String::from_utf8_lossy(&message)))
}
