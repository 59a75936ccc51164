//! The floor: tss-esapi straight on the swtpm TCTI in this process. The SRK (the TCG ECC P-256
//! template the vault uses) and one ECC P-256 signing key (the vault's template) are loaded,
//! then every signature is exactly one `TPM2_Sign` in a password session with a NULL hashcheck
//! ticket, the cheapest way the TPM signs an external digest.
//!
//! Also holds the TPM hygiene check the harness runs between phases.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context as _, Result};
use tpm_vault_daemon::formats::verify;
use tpm_vault_daemon::formats::{convert, templates};
use tpm_vault_daemon::model::KeyAlg;
use tss_esapi::constants::CapabilityType;
use tss_esapi::handles::{KeyHandle, TpmHandle, TransientTpmHandle};
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{CapabilityData, Digest, HashcheckTicket, Private, Public, PublicBuffer, SignatureScheme};
use tss_esapi::traits::Marshall;
use tss_esapi::tss2_esys::TPMT_TK_HASHCHECK;
use tss_esapi::{Context, TctiNameConf};

use super::{timed_loop, Pids, Timing, DIGEST};
use crate::stats::Measurement;

/// First transient handle (TPM_HT_TRANSIENT << 24).
const TRANSIENT_FIRST: u32 = 0x8000_0000;

/// A signing key created under the SRK: its wrapped blobs and public key.
#[derive(Debug, Clone)]
pub struct RawKey {
    /// Public area.
    pub public: Public,
    /// TPM-wrapped private area.
    pub private: Private,
    /// DER SubjectPublicKeyInfo, for checking signatures.
    pub spki: Vec<u8>,
}

/// Opens an ESAPI context on `tcti`.
///
/// # Errors
/// A bad TCTI string or an unreachable TPM.
pub fn connect(tcti: &str) -> Result<Context> {
    let conf: TctiNameConf = tcti.parse().with_context(|| format!("TCTI {tcti:?}"))?;
    Context::new(conf).with_context(|| format!("connecting to the TPM at {tcti}"))
}

/// Creates the vault's SRK (TCG ECC P-256 template) as a transient primary; the caller flushes it.
///
/// # Errors
/// TPM errors.
pub fn create_srk(ctx: &mut Context) -> Result<KeyHandle> {
    let template = templates::srk()?;
    let created = ctx
        .execute_with_session(Some(AuthSession::Password), |c| {
            c.create_primary(Hierarchy::Owner, template, None, None, None, None)
        })
        .context("TPM2_CreatePrimary (SRK)")?;
    Ok(created.key_handle)
}

/// The NULL hashcheck ticket an unrestricted key accepts for an externally computed digest.
///
/// # Errors
/// Never in practice (a constant structure).
pub fn null_hashcheck() -> Result<HashcheckTicket> {
    let raw = TPMT_TK_HASHCHECK {
        tag: tss_esapi::constants::tss::TPM2_ST_HASHCHECK,
        hierarchy: tss_esapi::constants::tss::TPM2_RH_NULL,
        digest: Default::default(),
    };
    HashcheckTicket::try_from(raw).context("NULL hashcheck ticket")
}

/// Creates the SRK and a signing key of `alg` (the vault's template) under it, then flushes
/// the SRK.
///
/// # Errors
/// TPM errors.
pub fn create_key(tcti: &str, alg: KeyAlg) -> Result<RawKey> {
    let mut ctx = connect(tcti)?;
    let srk = create_srk(&mut ctx)?;
    let template = templates::signing_key(alg, None, false)?;
    let created = ctx
        .execute_with_session(Some(AuthSession::Password), |c| c.create(srk, template, None, None, None, None))
        .context("TPM2_Create (signing key)")?;
    ctx.flush_context(srk.into()).context("flushing the SRK")?;
    let spki = convert::public_key_der(alg, &created.out_public)?;
    Ok(RawKey { public: created.out_public, private: created.out_private, spki })
}

/// Writes the key as the TPM2B files `tpm2_load -u/-r` read; returns (public, private) paths.
///
/// # Errors
/// Marshalling or file errors.
pub fn write_blobs(key: &RawKey, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let public =
        PublicBuffer::try_from(key.public.clone()).and_then(|b| b.marshall()).context("marshalling TPM2B_PUBLIC")?;
    let value = key.private.value();
    let len = u16::try_from(value.len()).context("private blob too long")?;
    let mut private = len.to_be_bytes().to_vec();
    private.extend_from_slice(value);
    let (pub_path, priv_path) = (dir.join("key.pub"), dir.join("key.priv"));
    std::fs::write(&pub_path, public).with_context(|| format!("{}", pub_path.display()))?;
    std::fs::write(&priv_path, private).with_context(|| format!("{}", priv_path.display()))?;
    Ok((pub_path, priv_path))
}

/// Loads the SRK and `key`, checks one signature in-core, then signs in a loop.
///
/// # Errors
/// TPM errors, or a signature that does not verify.
pub fn run(tcti: &str, key: &RawKey, timing: Timing, pids: Pids) -> Result<Measurement> {
    let mut signer = RawSigner::open(tcti, key)?;
    let m = timed_loop(timing, pids, || signer.sign())?;
    signer.close()?;
    Ok(m)
}

/// A connection with the SRK and one key loaded, signing one digest (in the key's default
/// scheme) with one `TPM2_Sign` a call.
pub struct RawSigner {
    ctx: Context,
    srk: KeyHandle,
    handle: KeyHandle,
    ticket: HashcheckTicket,
    digest: Digest,
    scheme: SignatureScheme,
}

impl std::fmt::Debug for RawSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSigner").finish_non_exhaustive()
    }
}

impl RawSigner {
    /// Connects, loads the SRK and the ECC P-256 `key`, and checks one ECDSA signature of
    /// [`DIGEST`] in-core.
    ///
    /// # Errors
    /// TPM errors, or a signature that does not verify.
    pub fn open(tcti: &str, key: &RawKey) -> Result<Self> {
        Self::open_for(tcti, key, KeyAlg::EccP256, &DIGEST)
    }

    /// Connects, loads the SRK and `key` (of `alg`), and checks one signature of `digest` in
    /// `alg`'s default scheme and hash in-core.
    ///
    /// # Errors
    /// TPM errors, or a signature that does not verify.
    pub fn open_for(tcti: &str, key: &RawKey, alg: KeyAlg, digest: &[u8]) -> Result<Self> {
        let mut ctx = connect(tcti)?;
        let srk = create_srk(&mut ctx)?;
        let handle = ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, key.private.clone(), key.public.clone()))
            .context("TPM2_Load")?;
        let (scheme, hash) = (alg.default_scheme(), alg.default_hash());
        let mut signer = Self {
            ctx,
            srk,
            handle,
            ticket: null_hashcheck()?,
            digest: Digest::try_from(digest.to_vec()).context("digest")?,
            scheme: convert::signature_scheme(scheme, hash),
        };
        let sig = signer.signature()?;
        let der = convert::encode_signature(alg, &sig)?;
        let valid = verify::verify_digest(alg, &key.spki, scheme, hash, digest, &der)?;
        ensure!(valid, "raw ESAPI {alg} signature does not verify");
        Ok(signer)
    }

    fn signature(&mut self) -> Result<tss_esapi::structures::Signature> {
        let (handle, digest, ticket, scheme) = (self.handle, self.digest.clone(), self.ticket.clone(), self.scheme);
        self.ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.sign(handle, digest, scheme, ticket))
            .context("TPM2_Sign")
    }

    /// One `TPM2_Sign`.
    ///
    /// # Errors
    /// TPM errors.
    pub fn sign(&mut self) -> Result<()> {
        self.signature().map(drop)
    }

    /// Flushes the key and the SRK.
    ///
    /// # Errors
    /// TPM errors.
    pub fn close(mut self) -> Result<()> {
        self.ctx.flush_context(self.handle.into()).context("flushing the key")?;
        self.ctx.flush_context(self.srk.into()).context("flushing the SRK")?;
        Ok(())
    }
}

/// Counts the transient objects loaded in the TPM and flushes them. Every phase must leave
/// none behind: raw swtpm has 3 object slots and no resource manager, so a leak would make the
/// next phase fail (and would be a finding in its own right).
///
/// # Errors
/// TPM errors.
pub fn flush_leftovers(tcti: &str) -> Result<usize> {
    let mut ctx = connect(tcti)?;
    let (data, _) =
        ctx.get_capability(CapabilityType::Handles, TRANSIENT_FIRST, 64).context("TPM2_GetCapability(handles)")?;
    let handles: Vec<u32> = match data {
        CapabilityData::Handles(list) => list.iter().map(|h| u32::from(*h)).collect(),
        _ => Vec::new(),
    };
    for &h in &handles {
        let tpm_handle = TpmHandle::Transient(TransientTpmHandle::new(h)?);
        let obj = ctx
            .execute_without_session(|c| c.tr_from_tpm_public(tpm_handle))
            .with_context(|| format!("Esys_TR_FromTPMPublic({h:#x})"))?;
        ctx.flush_context(obj).with_context(|| format!("flushing {h:#x}"))?;
    }
    Ok(handles.len())
}
