//! Attestation, sealing and random bytes: the daemon's RPCs against the same TPM work done with
//! raw ESAPI in this process, on the same swtpm, in the same round.
//!
//! - **Quote**: `AttestationService/Quote` over [`QUOTE_PCRS`] with a [`NONCE_LEN`]-byte nonce,
//!   against one raw `TPM2_Quote` with an AK (the vault's AK template) loaded. The daemon returns
//!   the PCR values with the quote: the values it read for an earlier quote when they hash to
//!   the new digest (PCRs unchanged, as here: one TPM command), else freshly read ones. A second
//!   raw peer does `TPM2_PCR_Read` + `TPM2_Quote`, the work of a quote whose PCRs changed.
//! - **Seal**: `SealService/Seal` of a 32-byte secret to the current [`SEAL_PCRS`] value
//!   (overwriting one record), against raw `TPM2_PCR_Read` + `TPM2_Create` of a sealed data
//!   object under the SRK with its PolicyPCR digest, through a long-lived salted HMAC session with
//!   parameter encryption, as the daemon does (`daemon/src/tpm/actor.rs`, `Tpm::create`). The
//!   daemon also encrypts the secret in-core and writes its record durably (fsync).
//! - **Unseal**: `SealService/Unseal`, against raw `TPM2_StartAuthSession` (policy session salted
//!   with the SRK, AES-128-CFB response encryption) + `TPM2_PolicyPCR` + `TPM2_Load` +
//!   `TPM2_Unseal` + flushing the session and the object: the daemon's sequence
//!   (`Tpm::unseal`).
//! - **Unseal with a signed policy**: a secret sealed to an authority's approval of the
//!   [`SEAL_PCRS`] values (`TPM2_PolicyAuthorize`), opened with a signed approval of the current
//!   values: `SealService/Unseal` with a [`tpm_vault_client::SignedPolicy`] from an offline
//!   P-256 authority, against raw ESAPI doing the daemon's TPM sequence
//!   (`Tpm::unseal` with `PolicyAuth::Authorized`): salted policy session, `TPM2_PolicyPCR`,
//!   `TPM2_LoadExternal` of the authority, `TPM2_ReadPublic`, `TPM2_VerifySignature`,
//!   `TPM2_PolicyAuthorize`, flush, `TPM2_Load`, `TPM2_Unseal`, flushes. The raw authority is
//!   the raw signing key, whose `TPM2_Sign` made the approval signature once. The daemon also
//!   checks the approval's envelope in-core and reads the PCRs to name a mismatch.
//! - **Cold signature peer**: raw `TPM2_Load` + `TPM2_Sign` + `TPM2_FlushContext`, what the
//!   daemon does when a key is not loaded (its figures are in the key-count section,
//!   [`crate::scale`]).
//! - **Random**: `CryptoService/GetRandom` of [`RANDOM_REQUEST`] bytes (the daemon's DRBG),
//!   against raw `TPM2_GetRandom` (at most [`TPM_RANDOM_REQUEST`] bytes a call, looped) and
//!   reading `/dev/urandom`.
//!
//! Raw ESAPI runs first (swtpm serves one connection at a time), then a fresh daemon on the
//! benchmark's state directory; the bulk-crypto streams ([`crate::bulk::stream_key_rpc`],
//! [`crate::bulk::library`], [`crate::bulk::stream_tuned`], [`crate::bulk::stream_current_thread`],
//! [`crate::bulk::cli_round`]) run on that daemon too. Every path's result is checked once before timing: quotes verify in-core
//! (`Quote::verify`) and carry the nonce, unsealed secrets equal the sealed ones.

use std::io::Read;
use std::path::Path;

use anyhow::{ensure, Context as _, Result};
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, PcrBinding, PolicyApproval, PolicyAuthority, SealOptions};
use tpm_vault_daemon::formats::{convert, pcr, templates};
use tpm_vault_daemon::model::{HashAlg, PcrBank, PcrSelection, Scheme};
use tss_esapi::attributes::SessionAttributesBuilder;
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Data, Digest, Name, Nonce, PcrSelectionList, Private, Public, SensitiveData, Signature, SignatureScheme,
    SymmetricDefinition,
};
use tss_esapi::Context;

use crate::agent::{self, AgentRound};
use crate::bulk::{self, Streams};
use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::raw::{connect, create_srk, null_hashcheck, RawKey};
use crate::sign::{timed_async, timed_loop, Pids, Timing, DIGEST};
use crate::stats::Measurement;

/// PCRs quoted on both paths.
pub const QUOTE_PCRS: &str = "sha256:0,7,9";
/// Nonce size on both paths (what `openssl rand -hex 20` gives a verifier).
pub const NONCE_LEN: usize = 20;
/// PCRs secrets are sealed to on both paths (the daemon's default).
pub const SEAL_PCRS: &str = "sha256:9";
/// Sealed secret name in the daemon.
pub const SECRET_NAME: &str = "bench-secret";
/// Name of the daemon's secret sealed to a policy authority.
pub const AUTHORIZED_SECRET_NAME: &str = "bench-authorized";
/// Bytes sealed.
pub const SECRET_LEN: usize = 32;
/// Bytes per daemon `GetRandom` request.
pub const RANDOM_REQUEST: usize = 1024 * 1024;
/// Bytes asked per raw `TPM2_GetRandom` (swtpm returns at most 64: a TPM2B_DIGEST).
pub const TPM_RANDOM_REQUEST: usize = 64;
/// Bytes per `/dev/urandom` read.
const URANDOM_READ: usize = 1024 * 1024;

/// The attestation key the raw phase quotes with (created once, untimed).
#[derive(Debug, Clone)]
pub struct RawAk {
    /// Public area.
    pub public: Public,
    /// TPM-wrapped private area.
    pub private: Private,
}

/// Creates an AK from the vault's template under the SRK.
///
/// # Errors
/// TPM errors.
pub fn create_ak(tcti: &str) -> Result<RawAk> {
    let mut ctx = connect(tcti)?;
    let srk = create_srk(&mut ctx)?;
    let template = templates::attestation_key()?;
    let created = ctx
        .execute_with_session(Some(AuthSession::Password), |c| c.create(srk, template, None, None, None, None))
        .context("TPM2_Create (AK)")?;
    ctx.flush_context(srk.into()).context("flushing the SRK")?;
    Ok(RawAk { public: created.out_public, private: created.out_private })
}

fn quote_selection() -> Result<PcrSelection> {
    PcrSelection::new(PcrBank::Sha256, &[0, 7, 9]).context("quote PCR selection")
}

fn seal_selection() -> Result<PcrSelection> {
    PcrSelection::new(PcrBank::Sha256, &[9]).context("seal PCR selection")
}

/// The nonce both paths quote over.
fn nonce() -> Vec<u8> {
    (0..NONCE_LEN as u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect()
}

/// The secret both paths seal.
fn secret() -> Vec<u8> {
    (0..SECRET_LEN as u8).map(|i| i ^ 0xa5).collect()
}

/// Raw ESAPI in this process: SRK, AK and a sealed object loaded or at hand, one long-lived
/// salted HMAC session for creating sealed objects. Each method is one operation.
pub struct RawOps {
    ctx: Context,
    srk: KeyHandle,
    ak: KeyHandle,
    /// False once [`RawOps::flush_ak`] ran.
    ak_loaded: bool,
    hmac: AuthSession,
    quote_list: PcrSelectionList,
    seal_sel: PcrSelection,
    seal_list: PcrSelectionList,
    nonce: Data,
    secret: Vec<u8>,
    /// The object the unseal loop opens (sealed in [`RawOps::open`]).
    sealed: Option<(Public, Private)>,
    /// The authorized-policy object and its approval (made in [`RawOps::open`]).
    authorized: Option<RawAuthorized>,
    /// The signing key the cold-sign loop loads each time.
    key: RawKey,
}

/// A secret sealed to `PolicyAuthorize` and the approval that opens it.
#[derive(Clone)]
struct RawAuthorized {
    /// The authority's public key, as `TPM2_LoadExternal` takes it.
    authority: Public,
    /// The approved PolicyPCR digest.
    approved: Digest,
    /// H(approved policy || empty policyRef): what the authority signed.
    approval_hash: Digest,
    /// The authority's signature over `approval_hash`.
    signature: Signature,
    /// The sealed object.
    object: (Public, Private),
}

impl std::fmt::Debug for RawOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawOps").finish_non_exhaustive()
    }
}

impl RawOps {
    /// Connects, creates the SRK, loads `ak`, starts the HMAC session, seals one object for
    /// the unseal loop and checks one quote and one unseal.
    ///
    /// # Errors
    /// TPM errors, or a check that fails.
    pub fn open(tcti: &str, ak: &RawAk, key: &RawKey) -> Result<Self> {
        let mut ctx = connect(tcti)?;
        let srk = create_srk(&mut ctx)?;
        let ak = ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, ak.private.clone(), ak.public.clone()))
            .context("TPM2_Load (AK)")?;
        let hmac = ctx
            .start_auth_session(
                Some(srk),
                None,
                None,
                SessionType::Hmac,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            )
            .context("TPM2_StartAuthSession (HMAC)")?
            .context("no session handle")?;
        let (attrs, mask) =
            SessionAttributesBuilder::new().with_decrypt(true).with_encrypt(true).with_continue_session(true).build();
        ctx.tr_sess_set_attributes(hmac, attrs, mask).context("Esys_TRSess_SetAttributes")?;
        let seal_sel = seal_selection()?;
        let mut ops = Self {
            ctx,
            srk,
            ak,
            ak_loaded: true,
            hmac,
            quote_list: pcr::selection_list(&quote_selection()?)?,
            seal_list: pcr::selection_list(&seal_sel)?,
            seal_sel,
            nonce: Data::try_from(nonce()).context("nonce")?,
            secret: secret(),
            sealed: None,
            authorized: None,
            key: key.clone(),
        };
        ops.sealed = Some(ops.seal()?);
        ops.authorized = Some(ops.seal_authorized()?);
        ensure!(ops.unseal_authorized()? == ops.secret, "raw authorized unseal returned another secret");
        let attest = ops.quote()?;
        ensure!(attest == nonce(), "raw quote does not carry the nonce");
        ensure!(ops.unseal()? == ops.secret, "raw unseal returned another secret");
        Ok(ops)
    }

    /// One `TPM2_Quote`; returns the quote's qualifying data (the nonce).
    ///
    /// # Errors
    /// TPM errors.
    pub fn quote(&mut self) -> Result<Vec<u8>> {
        let (ak, nonce, list) = (self.ak, self.nonce.clone(), self.quote_list.clone());
        let (attest, _signature) = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.quote(ak, nonce, SignatureScheme::Null, list))
            .context("TPM2_Quote")?;
        Ok(attest.extra_data().value().to_vec())
    }

    /// `TPM2_PCR_Read` + `TPM2_Quote` of the same PCRs (what the daemon's quote job does).
    ///
    /// # Errors
    /// TPM errors.
    pub fn pcr_read_and_quote(&mut self) -> Result<()> {
        let list = self.quote_list.clone();
        self.ctx.execute_without_session(|c| c.pcr_read(list)).context("TPM2_PCR_Read")?;
        self.quote().map(drop)
    }

    /// `TPM2_PCR_Read` of the sealing PCRs, the PolicyPCR digest in software, `TPM2_Create` of a
    /// sealed data object holding the secret through the encrypted HMAC session.
    ///
    /// # Errors
    /// TPM errors.
    pub fn seal(&mut self) -> Result<(Public, Private)> {
        let policy = self.policy_pcr_now()?;
        self.create_sealed(policy)
    }

    /// `TPM2_PCR_Read` of the sealing PCRs and their PolicyPCR digest, computed in software.
    fn policy_pcr_now(&mut self) -> Result<Vec<u8>> {
        let list = self.seal_list.clone();
        let (_, _, digests) = self.ctx.execute_without_session(|c| c.pcr_read(list)).context("TPM2_PCR_Read")?;
        let values: Vec<Vec<u8>> = digests.value().iter().map(|d| d.value().to_vec()).collect();
        Ok(pcr::policy_pcr_digest(&self.seal_sel, &values)?)
    }

    /// `TPM2_Create` of a sealed data object holding the secret under `policy`, through the
    /// encrypted HMAC session.
    fn create_sealed(&mut self, policy: Vec<u8>) -> Result<(Public, Private)> {
        let template = templates::sealed(Digest::try_from(policy).context("policy digest")?)?;
        let sensitive = SensitiveData::try_from(self.secret.clone()).context("sensitive data")?;
        let srk = self.srk;
        let created = self
            .ctx
            .execute_with_session(Some(self.hmac), |c| c.create(srk, template, None, Some(sensitive), None, None))
            .context("TPM2_Create (sealed object)")?;
        Ok((created.out_public, created.out_private))
    }

    /// Policy session (salted, response encryption) + `TPM2_PolicyPCR` + `TPM2_Load` +
    /// `TPM2_Unseal` + flushes; returns the secret.
    ///
    /// # Errors
    /// TPM errors.
    pub fn unseal(&mut self) -> Result<Vec<u8>> {
        let object = self.sealed.clone().context("nothing sealed yet")?;
        self.unseal_with(&object, None)
    }

    /// As [`RawOps::unseal`] for the object sealed to the authority, with its approval checked
    /// by the TPM between `TPM2_PolicyPCR` and `TPM2_Load`.
    ///
    /// # Errors
    /// TPM errors.
    pub fn unseal_authorized(&mut self) -> Result<Vec<u8>> {
        let authorized = self.authorized.clone().context("nothing sealed to the authority yet")?;
        self.unseal_with(&authorized.object, Some(&authorized))
    }

    fn unseal_with(&mut self, object: &(Public, Private), authorized: Option<&RawAuthorized>) -> Result<Vec<u8>> {
        let session = self
            .ctx
            .start_auth_session(
                Some(self.srk),
                None,
                None,
                SessionType::Policy,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            )
            .context("TPM2_StartAuthSession (policy)")?
            .context("no session handle")?;
        let result = self.unseal_in(session, object, authorized);
        let flushed = self.ctx.flush_context(ObjectHandle::from(SessionHandle::from(session)));
        let data = result?;
        flushed.context("flushing the policy session")?;
        Ok(data)
    }

    fn unseal_in(
        &mut self,
        session: AuthSession,
        (public, private): &(Public, Private),
        authorized: Option<&RawAuthorized>,
    ) -> Result<Vec<u8>> {
        let (attrs, mask) = SessionAttributesBuilder::new().with_encrypt(true).with_continue_session(true).build();
        self.ctx.tr_sess_set_attributes(session, attrs, mask).context("Esys_TRSess_SetAttributes")?;
        let policy = PolicySession::try_from(session).context("policy session")?;
        let list = self.seal_list.clone();
        self.ctx
            .execute_without_session(|c| c.policy_pcr(policy, Digest::default(), list))
            .context("TPM2_PolicyPCR")?;
        if let Some(a) = authorized {
            let key = self
                .ctx
                .execute_without_session(|c| c.load_external_public(a.authority.clone(), Hierarchy::Owner))
                .context("TPM2_LoadExternal (authority)")?;
            let result = (|| {
                let (_, name, _) = self.ctx.read_public(key).context("TPM2_ReadPublic")?;
                let ticket = self
                    .ctx
                    .execute_without_session(|c| c.verify_signature(key, a.approval_hash.clone(), a.signature.clone()))
                    .context("TPM2_VerifySignature")?;
                let approved = a.approved.clone();
                self.ctx
                    .execute_without_session(|c| c.policy_authorize(policy, approved, Nonce::default(), &name, ticket))
                    .context("TPM2_PolicyAuthorize")
            })();
            self.ctx.flush_context(key.into()).context("flushing the authority")?;
            result?;
        }
        let srk = self.srk;
        let (public, private) = (public.clone(), private.clone());
        let object = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, private, public))
            .context("TPM2_Load (sealed object)")?;
        let data = self.ctx.execute_with_session(Some(session), |c| c.unseal(object.into())).context("TPM2_Unseal");
        self.ctx.flush_context(object.into()).context("flushing the sealed object")?;
        Ok(data?.value().to_vec())
    }

    /// Untimed set-up of the authorized unseal: the raw signing key as the authority (its
    /// public part as `TPM2_LoadExternal` takes it, and its name), the PolicyPCR digest of the
    /// current values approved with one `TPM2_Sign`, and the secret sealed under
    /// `PolicyAuthorize(authority name, empty policyRef)`.
    fn seal_authorized(&mut self) -> Result<RawAuthorized> {
        let (x, y) = match &self.key.public {
            Public::Ecc { unique, .. } => (unique.x().value().to_vec(), unique.y().value().to_vec()),
            _ => anyhow::bail!("the raw signing key is not an ECC key"),
        };
        let authority = templates::external_p256(&x, &y)?;
        let key = self
            .ctx
            .execute_without_session(|c| c.load_external_public(authority.clone(), Hierarchy::Owner))
            .context("TPM2_LoadExternal (authority)")?;
        let name: Result<Name> = self.ctx.read_public(key).map(|(_, n, _)| n).context("TPM2_ReadPublic");
        self.ctx.flush_context(key.into()).context("flushing the authority")?;
        let name = name?;

        let approved = self.policy_pcr_now()?;
        // aHash = H(approvedPolicy || policyRef), policyRef empty.
        let approval_hash = Digest::try_from(HashAlg::Sha256.digest(&approved)).context("approval hash")?;
        let signature = self.sign_loading(approval_hash.clone()).context("signing the approval")?;
        let object = self.create_sealed(pcr::policy_authorize_digest(name.value(), &[]))?;
        Ok(RawAuthorized {
            authority,
            approved: Digest::try_from(approved).context("approved policy")?,
            approval_hash,
            signature,
            object,
        })
    }

    /// A signature with a key that is not loaded: `TPM2_Load` + `TPM2_Sign` + `TPM2_FlushContext`,
    /// what the daemon does when its LRU misses (it flushes the least recently used key first).
    ///
    /// # Errors
    /// TPM errors.
    pub fn sign_cold(&mut self) -> Result<()> {
        let digest = Digest::try_from(DIGEST.to_vec()).context("digest")?;
        self.sign_loading(digest).map(drop)
    }

    /// `TPM2_Load` of the signing key + one ECDSA-SHA256 `TPM2_Sign` of `digest` +
    /// `TPM2_FlushContext`.
    fn sign_loading(&mut self, digest: Digest) -> Result<Signature> {
        let (srk, public, private) = (self.srk, self.key.public.clone(), self.key.private.clone());
        let handle = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, private, public))
            .context("TPM2_Load")?;
        let (scheme, ticket) = (convert::signature_scheme(Scheme::Ecdsa, HashAlg::Sha256), null_hashcheck()?);
        let signed = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.sign(handle, digest, scheme, ticket))
            .context("TPM2_Sign");
        self.ctx.flush_context(handle.into()).context("flushing the key")?;
        signed
    }

    /// One `TPM2_GetRandom` of [`TPM_RANDOM_REQUEST`] bytes; returns the bytes received.
    ///
    /// # Errors
    /// TPM errors, or an empty answer.
    pub fn random(&mut self) -> Result<usize> {
        let d = self.ctx.execute_without_session(|c| c.get_random(TPM_RANDOM_REQUEST)).context("TPM2_GetRandom")?;
        ensure!(!d.value().is_empty(), "TPM2_GetRandom returned nothing");
        Ok(d.value().len())
    }

    /// Flushes the session, the AK and the SRK.
    ///
    /// # Errors
    /// TPM errors.
    pub fn close(mut self) -> Result<()> {
        self.ctx.flush_context(ObjectHandle::from(SessionHandle::from(self.hmac))).context("flushing the session")?;
        if self.ak_loaded {
            self.ctx.flush_context(self.ak.into()).context("flushing the AK")?;
        }
        self.ctx.flush_context(self.srk.into()).context("flushing the SRK")?;
        Ok(())
    }

    /// Flushes the AK (no more quotes): behind a resource manager every loaded object costs
    /// each command a ContextLoad, a ContextSave and a FlushContext, so the device phase seals
    /// and unseals with the SRK and the session alone.
    ///
    /// # Errors
    /// TPM errors.
    pub fn flush_ak(&mut self) -> Result<()> {
        if self.ak_loaded {
            self.ctx.flush_context(self.ak.into()).context("flushing the AK")?;
            self.ak_loaded = false;
        }
        Ok(())
    }
}

/// The same operations through the daemon with the client library.
#[derive(Debug, Clone)]
pub struct DaemonOps {
    client: Client,
    quote_pcrs: PcrBinding,
    seal: SealOptions,
    nonce: Vec<u8>,
    secret: Vec<u8>,
    /// A signed approval of the current [`SEAL_PCRS`] values, for [`AUTHORIZED_SECRET_NAME`].
    approval: Vec<u8>,
}

impl DaemonOps {
    /// Connects and checks each operation once: a quote that verifies over the nonce, a seal
    /// and an unseal that returns the secret, a random request of the right size.
    ///
    /// # Errors
    /// RPC errors, or a check that fails.
    pub async fn connect(socket: &Path) -> Result<Self> {
        let client = Client::connect(socket).await.with_context(|| format!("connecting to {}", socket.display()))?;
        let mut ops = Self {
            client,
            quote_pcrs: QUOTE_PCRS.parse().context("quote PCRs")?,
            seal: SealOptions::new().with_pcrs(SEAL_PCRS.parse().context("seal PCRs")?).with_overwrite(true),
            nonce: nonce(),
            secret: secret(),
            approval: Vec::new(),
        };
        ops.approval = ops.seal_authorized().await?;
        let quote = ops.client.quote(&ops.quote_pcrs, &ops.nonce).await.context("Quote RPC")?;
        quote.verify(&ops.nonce, &[]).context("the daemon's quote does not verify")?;
        ops.seal().await?;
        let unsealed = ops.client.unseal(SECRET_NAME, None).await.context("Unseal RPC")?;
        ensure!(unsealed.as_slice() == ops.secret.as_slice(), "the daemon unsealed another secret");
        let unsealed = ops.client.unseal(AUTHORIZED_SECRET_NAME, Some(&ops.approval)).await.context("Unseal RPC")?;
        ensure!(unsealed.as_slice() == ops.secret.as_slice(), "the daemon's authorized unseal gave another secret");
        ensure!(ops.client.random(RANDOM_REQUEST).await?.len() == RANDOM_REQUEST, "short GetRandom answer");
        Ok(ops)
    }

    /// The client (for the other phases on this daemon).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// One Quote RPC.
    ///
    /// # Errors
    /// RPC errors.
    pub async fn quote(&self) -> Result<()> {
        self.client.quote(&self.quote_pcrs, &self.nonce).await.map(drop).context("Quote RPC")
    }

    /// One Seal RPC (replacing the record).
    ///
    /// # Errors
    /// RPC errors.
    pub async fn seal(&self) -> Result<()> {
        self.client.seal(SECRET_NAME, &self.secret, &self.seal).await.map(drop).context("Seal RPC")
    }

    /// One Unseal RPC.
    ///
    /// # Errors
    /// RPC errors.
    pub async fn unseal(&self) -> Result<()> {
        self.client.unseal(SECRET_NAME, None).await.map(drop).context("Unseal RPC")
    }

    /// Seals the secret to a fresh offline P-256 authority (replacing the record) and returns
    /// the authority's signed approval of the current [`SEAL_PCRS`] values.
    async fn seal_authorized(&self) -> Result<Vec<u8>> {
        let pem = rcgen::KeyPair::generate().context("generating the policy authority")?.serialize_pem();
        let authority = PolicyAuthority::from_pem(&pem).context("the policy authority's key")?;
        let pcrs: PcrBinding = SEAL_PCRS.parse().context("seal PCRs")?;
        let options =
            SealOptions::new().with_pcrs(pcrs.clone()).with_authority(authority.public_key_der()).with_overwrite(true);
        self.client.seal(AUTHORIZED_SECRET_NAME, &self.secret, &options).await.context("Seal RPC (authorized)")?;
        let current = self.client.read_pcrs(Some(&pcrs)).await.context("ReadPcrs RPC")?;
        let approval = PolicyApproval::new(&current.to_binding()?)?;
        Ok(authority.sign(&approval).to_bytes())
    }

    /// One Unseal RPC of the secret sealed to the authority, with its signed approval.
    ///
    /// # Errors
    /// RPC errors.
    pub async fn unseal_authorized(&self) -> Result<()> {
        self.client.unseal(AUTHORIZED_SECRET_NAME, Some(&self.approval)).await.map(drop).context("Unseal RPC")
    }

    /// One GetRandom RPC of [`RANDOM_REQUEST`] bytes.
    ///
    /// # Errors
    /// RPC errors.
    pub async fn random(&self) -> Result<()> {
        self.client.random(RANDOM_REQUEST).await.map(drop).context("GetRandom RPC")
    }
}

/// A rate in bytes per second, from a measurement of operations that each moved about
/// `bytes_per_op` bytes.
#[derive(Debug, Clone, Default)]
pub struct ByteRate {
    /// The operations.
    pub m: Measurement,
    /// Mean bytes per operation.
    pub bytes_per_op: f64,
}

impl ByteRate {
    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.m.rate() * self.bytes_per_op
    }
}

/// What one round measured.
#[derive(Debug, Clone)]
pub struct OpsRound {
    /// Raw `TPM2_Quote`.
    pub quote_raw: Measurement,
    /// Raw `TPM2_PCR_Read` + `TPM2_Quote`.
    pub quote_raw_pcr: Measurement,
    /// Quote RPC.
    pub quote_daemon: Measurement,
    /// Raw `TPM2_PCR_Read` + `TPM2_Create` (sealed object).
    pub seal_raw: Measurement,
    /// Seal RPC.
    pub seal_daemon: Measurement,
    /// Raw policy session + `TPM2_Load` + `TPM2_Unseal`.
    pub unseal_raw: Measurement,
    /// Unseal RPC.
    pub unseal_daemon: Measurement,
    /// Raw unseal through `TPM2_PolicyAuthorize` (the daemon's sequence).
    pub unseal_auth_raw: Measurement,
    /// Unseal RPC of a secret sealed to a policy authority, with a signed approval.
    pub unseal_auth_daemon: Measurement,
    /// Raw `TPM2_Load` + `TPM2_Sign` + `TPM2_FlushContext` (the peer of a cold daemon signature).
    pub sign_cold_raw: Measurement,
    /// Raw `TPM2_GetRandom`.
    pub random_tpm: ByteRate,
    /// `/dev/urandom`.
    pub random_urandom: ByteRate,
    /// GetRandom RPC.
    pub random_daemon: ByteRate,
}

/// Everything the phase needs.
#[derive(Debug, Clone)]
pub struct OpsSetup {
    /// The daemon (binary, TCTI, state dir, scratch dir).
    pub daemon: Setup,
    /// The raw phase's AK.
    pub ak: RawAk,
    /// The raw phase's signing key (for the cold-sign peer).
    pub key: RawKey,
    /// Plaintext bytes of the daemon's encrypt stream.
    pub stream_bytes: u64,
    /// The `tpm-vault` binary and the files of its `encrypt`/`decrypt` runs.
    pub cli: bulk::CliSetup,
}

/// The raw ESAPI half of a round.
struct RawRound {
    quote: Measurement,
    quote_pcr: Measurement,
    seal: Measurement,
    unseal: Measurement,
    unseal_auth: Measurement,
    sign_cold: Measurement,
    random: ByteRate,
}

/// The daemon's operations of a round.
struct DaemonFigures {
    quote: Measurement,
    seal: Measurement,
    unseal: Measurement,
    unseal_auth: Measurement,
    random: ByteRate,
}

/// Raw ESAPI: quote, seal, unseal, cold sign and `TPM2_GetRandom`, one after another.
fn raw_round(setup: &OpsSetup, timing: Timing, pids: Pids) -> Result<RawRound> {
    let mut raw = RawOps::open(&setup.daemon.tcti, &setup.ak, &setup.key)?;
    let quote = timed_loop(timing, pids, || raw.quote().map(drop))?;
    let quote_pcr = timed_loop(timing, pids, || raw.pcr_read_and_quote())?;
    let seal = timed_loop(timing, pids, || raw.seal().map(drop))?;
    let unseal = timed_loop(timing, pids, || raw.unseal().map(drop))?;
    let unseal_auth = timed_loop(timing, pids, || raw.unseal_authorized().map(drop))?;
    let sign_cold = timed_loop(timing, pids, || raw.sign_cold())?;
    let mut tpm_bytes = (0u64, 0u64);
    let tpm_m = timed_loop(timing, pids, || {
        let n = raw.random()?;
        tpm_bytes = (tpm_bytes.0 + n as u64, tpm_bytes.1 + 1);
        Ok(())
    })?;
    raw.close()?;
    let random = ByteRate { m: tpm_m, bytes_per_op: tpm_bytes.0 as f64 / tpm_bytes.1.max(1) as f64 };
    Ok(RawRound { quote, quote_pcr, seal, unseal, unseal_auth, sign_cold, random })
}

/// A fresh daemon: its operations, the encrypt streams (client library, in the daemon, tonic
/// directly, the CLI) and the SSH agent; stopped after.
fn daemon_round(
    setup: &OpsSetup,
    round: usize,
    timing: Timing,
    swtpm_pid: u32,
    rt: &Runtime,
) -> Result<(DaemonFigures, Streams, AgentRound)> {
    let uid = nix::unistd::getuid().as_raw();
    let (daemon, _ready) = Daemon::start_with(&setup.daemon, &format!("ops-round{round}.log"), &policy_allow_all(uid))?;
    let pids = Pids { swtpm: swtpm_pid, daemon: Some(daemon.pid()) };
    let measured = rt.block_on(async {
        let ops = DaemonOps::connect(daemon.socket()).await?;
        let quote = timed_async(timing, pids, || ops.quote()).await?;
        let seal = timed_async(timing, pids, || ops.seal()).await?;
        let unseal = timed_async(timing, pids, || ops.unseal()).await?;
        let unseal_auth = timed_async(timing, pids, || ops.unseal_authorized()).await?;
        let random = timed_async(timing, pids, || ops.random()).await?;
        let random = ByteRate { m: random, bytes_per_op: RANDOM_REQUEST as f64 };
        let stream_key = bulk::stream_key_rpc(ops.client(), timing, pids).await?;
        let all = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
        let library_one = bulk::library(ops.client(), 1, setup.stream_bytes).await?;
        let library_all = bulk::library(ops.client(), all, setup.stream_bytes).await?;
        let tuned = bulk::stream_tuned(daemon.socket(), pids, setup.stream_bytes.min(bulk::TUNED_MAX_BYTES)).await?;
        let d = DaemonFigures { quote, seal, unseal, unseal_auth, random };
        anyhow::Ok((d, (stream_key, library_one, library_all, tuned)))
    });
    let measured = measured.and_then(|(d, (stream_key, library_one, library_all, tuned))| {
        let in_daemon = bulk::stream_current_thread(daemon.socket(), pids, setup.stream_bytes)?;
        let cli = Some(bulk::cli_round(&setup.cli, daemon.socket())?);
        let agent = agent::run(&setup.cli.binary, daemon.socket(), &setup.cli.dir, timing, rt)?;
        Ok((d, Streams { daemon: in_daemon, tuned, library_one, library_all, stream_key, cli }, agent))
    });
    let measured = measured.map_err(|e| e.context(format!("daemon log:\n{}", daemon.log_tail())))?;
    daemon.stop()?;
    Ok(measured)
}

/// One round: raw ESAPI, `/dev/urandom`, then a daemon (operations, then the encrypt stream
/// through the client library and through tonic directly).
///
/// # Errors
/// TPM, RPC and start/stop errors; failed checks.
pub fn run(
    setup: &OpsSetup,
    round: usize,
    timing: Timing,
    swtpm_pid: u32,
    rt: &Runtime,
    mut progress: impl FnMut(&str),
) -> Result<(OpsRound, Streams, AgentRound)> {
    let pids = Pids { swtpm: swtpm_pid, daemon: None };
    let raw = raw_round(setup, timing, pids)?;
    progress(&format!(
        "raw ESAPI: quote p50 {:.0} µs, PCR_Read + quote {:.0} µs, seal {:.0} µs, unseal {:.0} µs, \
         authorized unseal {:.0} µs, load + sign + flush {:.0} µs, TPM2_GetRandom {:.0} B/s",
        us(&raw.quote),
        us(&raw.quote_pcr),
        us(&raw.seal),
        us(&raw.unseal),
        us(&raw.unseal_auth),
        us(&raw.sign_cold),
        raw.random.bytes_per_sec()
    ));
    let random_urandom = urandom(timing, pids)?;
    let (d, streams, agent) = daemon_round(setup, round, timing, swtpm_pid, rt)?;
    progress(&format!(
        "daemon: quote p50 {:.0} µs, seal {:.0} µs, unseal {:.0} µs, authorized unseal {:.0} µs, \
         GetRandom {:.0} MiB/s, encrypt stream in the daemon {:.0} MiB/s (tonic directly, 1 MiB messages: \
         {:.0}), client library from memory on 1 thread {:.0} MiB/s, CreateStreamKey p50 {:.0} µs",
        us(&d.quote),
        us(&d.seal),
        us(&d.unseal),
        us(&d.unseal_auth),
        d.random.bytes_per_sec() / MIB,
        streams.daemon.bytes_per_sec() / MIB,
        streams.tuned.bytes_per_sec() / MIB,
        streams.library_one.encrypt / MIB,
        us(&streams.stream_key)
    ));
    let r = OpsRound {
        quote_raw: raw.quote,
        quote_raw_pcr: raw.quote_pcr,
        quote_daemon: d.quote,
        seal_raw: raw.seal,
        seal_daemon: d.seal,
        unseal_raw: raw.unseal,
        unseal_daemon: d.unseal,
        unseal_auth_raw: raw.unseal_auth,
        unseal_auth_daemon: d.unseal_auth,
        sign_cold_raw: raw.sign_cold,
        random_tpm: raw.random,
        random_urandom,
        random_daemon: d.random,
    };
    Ok((r, streams, agent))
}

const MIB: f64 = 1024.0 * 1024.0;

fn us(m: &Measurement) -> f64 {
    m.p50().as_secs_f64() * 1e6
}

/// Reads `/dev/urandom` in 1 MiB reads.
fn urandom(timing: Timing, pids: Pids) -> Result<ByteRate> {
    let mut f = std::fs::File::open("/dev/urandom").context("opening /dev/urandom")?;
    let mut buf = vec![0u8; URANDOM_READ];
    let m = timed_loop(timing, pids, || f.read_exact(&mut buf).context("reading /dev/urandom"))?;
    Ok(ByteRate { m, bytes_per_op: URANDOM_READ as f64 })
}
