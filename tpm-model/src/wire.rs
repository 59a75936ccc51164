//! TPM 2.0 wire format, only as far as the model needs it: headers, the handle and parameter
//! areas, the few commands the resource manager sends itself, and command names.
//!
//! Every buffer starts with a 10-byte header: tag (u16), total size (u32), then the command
//! code or response code (u32), big-endian (TPM 2.0 Part 1, 18.2). Owns no state.

use std::io::{self, Read, Write};

/// Header size of every TPM command and response.
pub const HEADER: usize = 10;
/// Largest command or response the model accepts (TPM buffers are a few KiB at most).
pub const MAX_BUFFER: usize = 64 * 1024;

/// TPM_ST_NO_SESSIONS.
pub const ST_NO_SESSIONS: u16 = 0x8001;
/// TPM_ST_SESSIONS.
pub const ST_SESSIONS: u16 = 0x8002;

/// TPM_HT_TRANSIENT, in a handle's top byte.
pub const HT_TRANSIENT: u32 = 0x8000_0000;
/// TPM_HT_HMAC_SESSION (a loaded session).
pub const HT_HMAC_SESSION: u32 = 0x0200_0000;
/// TPM_HT_POLICY_SESSION (a saved session in GetCapability's numbering).
pub const HT_POLICY_SESSION: u32 = 0x0300_0000;
/// TPM_RH_NULL.
pub const RH_NULL: u32 = 0x4000_0007;

/// TPM_CAP_HANDLES.
pub const CAP_HANDLES: u32 = 1;
/// TPM_CAP_COMMANDS.
pub const CAP_COMMANDS: u32 = 2;

/// TPM_RC_SUCCESS.
pub const RC_SUCCESS: u32 = 0;
/// TPM_RC_HANDLE (format-one value, without the handle/parameter number).
pub const RC_HANDLE: u32 = 0x08B;
/// TPM_RC_REFERENCE_H0: the first handle references a transient object or session that is not
/// loaded.
pub const RC_REFERENCE_H0: u32 = 0x910;
/// TPM_RC_COMMAND_CODE.
pub const RC_COMMAND_CODE: u32 = 0x143;
/// The layer the kernel's resource manager puts on response codes it makes up itself
/// (`TSS2_RESMGR_TPM_RC_LAYER` in `include/linux/tpm.h`: 11 << 16).
pub const RESMGR_LAYER: u32 = 11 << 16;

/// Command codes (TPM 2.0 Part 2, table 12) the model looks at.
pub mod cc {
    /// TPM2_GetCommandAuditDigest.
    pub const GET_COMMAND_AUDIT_DIGEST: u32 = 0x133;
    /// TPM2_CreatePrimary.
    pub const CREATE_PRIMARY: u32 = 0x131;
    /// TPM2_Certify.
    pub const CERTIFY: u32 = 0x148;
    /// TPM2_CertifyCreation.
    pub const CERTIFY_CREATION: u32 = 0x14A;
    /// TPM2_GetTime.
    pub const GET_TIME: u32 = 0x14C;
    /// TPM2_GetSessionAuditDigest.
    pub const GET_SESSION_AUDIT_DIGEST: u32 = 0x14D;
    /// TPM2_Create.
    pub const CREATE: u32 = 0x153;
    /// TPM2_ECDH_ZGen.
    pub const ECDH_ZGEN: u32 = 0x154;
    /// TPM2_Load.
    pub const LOAD: u32 = 0x157;
    /// TPM2_Quote.
    pub const QUOTE: u32 = 0x158;
    /// TPM2_RSA_Decrypt.
    pub const RSA_DECRYPT: u32 = 0x159;
    /// TPM2_Sign.
    pub const SIGN: u32 = 0x15D;
    /// TPM2_Unseal.
    pub const UNSEAL: u32 = 0x15E;
    /// TPM2_ContextLoad.
    pub const CONTEXT_LOAD: u32 = 0x161;
    /// TPM2_ContextSave.
    pub const CONTEXT_SAVE: u32 = 0x162;
    /// TPM2_ECDH_KeyGen.
    pub const ECDH_KEYGEN: u32 = 0x163;
    /// TPM2_FlushContext.
    pub const FLUSH_CONTEXT: u32 = 0x165;
    /// TPM2_StartAuthSession.
    pub const START_AUTH_SESSION: u32 = 0x176;
    /// TPM2_VerifySignature.
    pub const VERIFY_SIGNATURE: u32 = 0x177;
    /// TPM2_GetCapability.
    pub const GET_CAPABILITY: u32 = 0x17A;
    /// TPM2_GetRandom.
    pub const GET_RANDOM: u32 = 0x17B;
    /// TPM2_NV_Certify.
    pub const NV_CERTIFY: u32 = 0x184;
    /// TPM2_CreateLoaded.
    pub const CREATE_LOADED: u32 = 0x191;
}

/// Algorithm identifiers (TPM 2.0 Part 2, table 9) the model looks at.
pub mod alg {
    /// TPM_ALG_RSA.
    pub const RSA: u16 = 0x0001;
    /// TPM_ALG_KEYEDHASH.
    pub const KEYEDHASH: u16 = 0x0008;
    /// TPM_ALG_NULL.
    pub const NULL: u16 = 0x0010;
    /// TPM_ALG_RSASSA.
    pub const RSASSA: u16 = 0x0014;
    /// TPM_ALG_RSAES.
    pub const RSAES: u16 = 0x0015;
    /// TPM_ALG_RSAPSS.
    pub const RSAPSS: u16 = 0x0016;
    /// TPM_ALG_OAEP.
    pub const OAEP: u16 = 0x0017;
    /// TPM_ALG_ECDSA.
    pub const ECDSA: u16 = 0x0018;
    /// TPM_ALG_ECDAA.
    pub const ECDAA: u16 = 0x001A;
    /// TPM_ALG_SM2.
    pub const SM2: u16 = 0x001B;
    /// TPM_ALG_ECSCHNORR.
    pub const ECSCHNORR: u16 = 0x001C;
    /// TPM_ALG_ECC.
    pub const ECC: u16 = 0x0023;
    /// TPM_ECC_NIST_P384 (a curve, not an algorithm).
    pub const CURVE_P384: u16 = 0x0004;
    /// TPM_ECC_NIST_P521.
    pub const CURVE_P521: u16 = 0x0005;
}

/// A command's or response's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// TPM_ST_NO_SESSIONS or TPM_ST_SESSIONS.
    pub tag: u16,
    /// Total size, header included.
    pub size: u32,
    /// Command code (commands) or response code (responses).
    pub code: u32,
}

/// The header of `buf` (which must hold at least [`HEADER`] bytes).
pub fn header(buf: &[u8]) -> Header {
    Header { tag: u16_at(buf, 0).unwrap_or(0), size: u32_at(buf, 2).unwrap_or(0), code: u32_at(buf, 6).unwrap_or(0) }
}

/// Big-endian u16 at `at`.
pub fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    buf.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// Big-endian u32 at `at`.
pub fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Writes a big-endian u32 at `at` (no-op when out of range).
pub fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(b) = buf.get_mut(at..at + 4) {
        b.copy_from_slice(&v.to_be_bytes());
    }
}

/// Where a command's parameters start: after the header, `handles` handles and, with
/// sessions, the authorization area (its u32 size, then the area).
pub fn command_params(cmd: &[u8], handles: usize) -> Option<usize> {
    let mut at = HEADER + 4 * handles;
    if header(cmd).tag == ST_SESSIONS {
        at += 4 + u32_at(cmd, at)? as usize;
    }
    (at <= cmd.len()).then_some(at)
}

/// Where a successful response's parameters start: after the header, `handles` handles and,
/// with sessions, the u32 parameter size.
pub fn response_params(rsp: &[u8], handles: usize) -> Option<usize> {
    let mut at = HEADER + 4 * handles;
    if header(rsp).tag == ST_SESSIONS {
        at += 4;
    }
    (at <= rsp.len()).then_some(at)
}

/// Skips a TPM2B (u16 size, then the bytes) at `at`; returns the offset after it.
pub fn skip_tpm2b(buf: &[u8], at: usize) -> Option<usize> {
    let end = at + 2 + usize::from(u16_at(buf, at)?);
    (end <= buf.len()).then_some(end)
}

/// Builds a command: header (size filled in) and body.
pub fn command(tag: u16, code: u32, body: &[u8]) -> Vec<u8> {
    let mut c = Vec::with_capacity(HEADER + body.len());
    c.extend_from_slice(&tag.to_be_bytes());
    c.extend_from_slice(&((HEADER + body.len()) as u32).to_be_bytes());
    c.extend_from_slice(&code.to_be_bytes());
    c.extend_from_slice(body);
    c
}

/// A bare response carrying only `rc`.
pub fn error_response(rc: u32) -> Vec<u8> {
    let mut r = Vec::with_capacity(HEADER);
    r.extend_from_slice(&ST_NO_SESSIONS.to_be_bytes());
    r.extend_from_slice(&(HEADER as u32).to_be_bytes());
    r.extend_from_slice(&rc.to_be_bytes());
    r
}

/// The kernel's value of a response code: format-one codes without their handle, session or
/// parameter number (`tpm2_rc_value`).
pub fn rc_value(rc: u32) -> u32 {
    if rc & 0x80 != 0 {
        rc & 0xFF
    } else {
        rc
    }
}

/// Reads one TPM buffer (header, then the rest); `Ok(None)` at a clean end of stream.
///
/// # Errors
/// I/O errors and buffers whose size field is out of bounds.
pub fn read_buffer(from: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut head = [0u8; HEADER];
    match from.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let size = u32::from_be_bytes([head[2], head[3], head[4], head[5]]) as usize;
    if !(HEADER..=MAX_BUFFER).contains(&size) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("TPM buffer of {size} bytes")));
    }
    let mut buf = vec![0u8; size];
    buf[..HEADER].copy_from_slice(&head);
    from.read_exact(&mut buf[HEADER..])?;
    Ok(Some(buf))
}

/// Writes one TPM buffer.
///
/// # Errors
/// I/O errors.
pub fn write_buffer(to: &mut impl Write, buf: &[u8]) -> io::Result<()> {
    to.write_all(buf)?;
    to.flush()
}

/// The name of a command code (`0x15d` → `Sign`), or its hex value.
pub fn command_name(code: u32) -> String {
    let name = match code {
        0x11F => "NV_UndefineSpaceSpecial",
        0x120 => "EvictControl",
        0x121 => "HierarchyControl",
        0x12A => "NV_DefineSpace",
        0x12C => "ChangeEPS",
        0x131 => "CreatePrimary",
        0x133 => "GetCommandAuditDigest",
        0x137 => "NV_Write",
        0x139 => "Clear",
        0x13A => "NV_Extend",
        0x143 => "SelfTest",
        0x144 => "Startup",
        0x145 => "Shutdown",
        0x148 => "Certify",
        0x14A => "CertifyCreation",
        0x14C => "GetTime",
        0x14D => "GetSessionAuditDigest",
        0x14E => "NV_Read",
        0x150 => "ObjectChangeAuth",
        0x151 => "PolicySecret",
        0x153 => "Create",
        0x154 => "ECDH_ZGen",
        0x155 => "HMAC",
        0x156 => "Import",
        0x157 => "Load",
        0x158 => "Quote",
        0x159 => "RSA_Decrypt",
        0x15B => "HMAC_Start",
        0x15D => "Sign",
        0x15E => "Unseal",
        0x160 => "PolicySigned",
        0x161 => "ContextLoad",
        0x162 => "ContextSave",
        0x163 => "ECDH_KeyGen",
        0x164 => "EncryptDecrypt",
        0x165 => "FlushContext",
        0x167 => "LoadExternal",
        0x168 => "MakeCredential",
        0x169 => "NV_ReadPublic",
        0x16B => "PolicyCommandCode",
        0x16D => "PolicyOR",
        0x171 => "ActivateCredential",
        0x173 => "ReadPublic",
        0x174 => "RSA_Encrypt",
        0x176 => "StartAuthSession",
        0x177 => "VerifySignature",
        0x17A => "GetCapability",
        0x17B => "GetRandom",
        0x17C => "GetTestResult",
        0x17D => "Hash",
        0x17E => "PCR_Read",
        0x17F => "PolicyPCR",
        0x180 => "PolicyRestart",
        0x182 => "PCR_Extend",
        0x183 => "PCR_SetAuthValue",
        0x184 => "NV_Certify",
        0x189 => "PolicyGetDigest",
        0x18A => "TestParms",
        0x18F => "PolicyAuthorize",
        0x191 => "CreateLoaded",
        0x193 => "EncryptDecrypt2",
        _ => return format!("{code:#x}"),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_and_values() {
        // GetRandom(8), no sessions.
        let c = command(ST_NO_SESSIONS, cc::GET_RANDOM, &[0, 8]);
        assert_eq!(header(&c), Header { tag: ST_NO_SESSIONS, size: 12, code: cc::GET_RANDOM });
        assert_eq!(command_params(&c, 0), Some(10));
        // One handle, sessions with a 9-byte auth area.
        let mut body = vec![0x80, 0, 0, 1, 0, 0, 0, 9];
        body.extend_from_slice(&[0x40, 0, 0, 9, 0, 0, 1, 0, 0]);
        body.extend_from_slice(&[0, 2, 0xAA, 0xBB]);
        let c = command(ST_SESSIONS, cc::SIGN, &body);
        let p = command_params(&c, 1).unwrap_or(0);
        assert_eq!(p, 10 + 4 + 4 + 9);
        assert_eq!(skip_tpm2b(&c, p), Some(c.len()));
        assert_eq!(rc_value(0x18B), RC_HANDLE);
        assert_eq!(rc_value(RC_REFERENCE_H0), RC_REFERENCE_H0);
        assert_eq!(command_name(cc::SIGN), "Sign");
        assert_eq!(command_name(0x120), "EvictControl");
        assert_eq!(command_name(0x1FF), "0x1ff");
    }
}
