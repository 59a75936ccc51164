//! Sealed secrets: what a `Seal` call binds a secret to, and what it reports.
//!
//! Owns the [`Client`] methods of `tpmvault.v1.SealService`, [`SealOptions`] (PCR binding,
//! policy authority, overwrite) and [`SealInfo`]. The secret itself is never kept here: it
//! goes straight into the request. The signed-approval format and offline signing are in
//! `policy`.

use tpm_vault_proto::v1 as proto;
use zeroize::Zeroizing;

use crate::{Client, Error, PcrBinding, PolicyApproval, SignedPolicy};

/// Largest secret the daemon seals (64 MiB).
pub const MAX_SECRET: usize = 64 * 1024 * 1024;

/// Largest `SealService` message: a secret plus the request's other fields.
pub(crate) const MAX_SEAL_MESSAGE: usize = MAX_SECRET + 4096;

/// How a secret is sealed.
///
/// By default: to the current value of PCR 9 (sha256), the boot loader's kernel measurement.
///
/// ```
/// use tpm_vault_client::{PcrBinding, SealOptions};
///
/// // To the value PCR 9 will have after the next boot, replacing an existing secret.
/// let next: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse()?;
/// let options = SealOptions::new().with_pcrs(next).with_overwrite(true);
/// # let _ = options;
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SealOptions {
    /// PCRs (and optionally values) to seal to; `None` lets the daemon pick sha256:9.
    pcrs: Option<PcrBinding>,
    /// SPKI (DER or PEM) of the policy authority whose signed approvals open the secret.
    authorized_by: Option<Vec<u8>>,
    /// Replace a secret of the same name instead of failing with `AlreadyExists`.
    overwrite: bool,
}

impl SealOptions {
    /// Seal to the current value of sha256:9.
    pub fn new() -> SealOptions {
        SealOptions::default()
    }

    /// Seal to these PCRs: their current values, or the values given (e.g. future ones).
    pub fn with_pcrs(mut self, pcrs: PcrBinding) -> SealOptions {
        self.pcrs = Some(pcrs);
        self
    }

    /// Open for whatever PCR values this ECC P-256 authority (SubjectPublicKeyInfo, DER or
    /// PEM) approves in a signed policy (TPM2_PolicyAuthorize), so that a kernel update needs
    /// a new signature rather than a re-seal. PCR values given with
    /// [`with_pcrs`](SealOptions::with_pcrs) are then ignored; only the indices count.
    pub fn with_authority(mut self, spki_der_or_pem: impl Into<Vec<u8>>) -> SealOptions {
        self.authorized_by = Some(spki_der_or_pem.into());
        self
    }

    /// Replace an existing secret of the same name.
    pub fn with_overwrite(mut self, overwrite: bool) -> SealOptions {
        self.overwrite = overwrite;
        self
    }

    /// The PCR binding, if one was set.
    pub fn pcrs(&self) -> Option<&PcrBinding> {
        self.pcrs.as_ref()
    }

    /// The policy authority, if one was set.
    pub fn authority(&self) -> Option<&[u8]> {
        self.authorized_by.as_deref()
    }

    /// The API request sealing `secret` under `name`.
    pub(crate) fn to_request(&self, name: &str, secret: &[u8]) -> proto::SealRequest {
        proto::SealRequest {
            name: name.to_owned(),
            secret: secret.to_vec(),
            pcr_binding: self.pcrs.as_ref().map(PcrBinding::to_proto),
            authorized_by: self.authorized_by.clone().unwrap_or_default(),
            overwrite: self.overwrite,
        }
    }
}

/// What the daemon reports about a sealed secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealInfo {
    /// The secret's name.
    pub name: String,
    /// The sealed object's policy digest, hex (PolicyPCR or PolicyAuthorize).
    pub policy_digest: String,
    /// The PCRs the secret is bound to, e.g. `sha256:9`.
    pub pcrs: String,
}

impl From<proto::SealResponse> for SealInfo {
    fn from(r: proto::SealResponse) -> SealInfo {
        SealInfo { name: r.name, policy_digest: r.policy_digest, pcrs: r.pcrs }
    }
}

impl Client {
    /// Seals a secret of any size (up to [`MAX_SECRET`]): the TPM seals a fresh 256-bit key
    /// under a PCR policy (or a policy authority's), and the data is AES-256-GCM-encrypted by
    /// the daemon.
    ///
    /// # Errors
    /// `AlreadyExists` unless overwriting, `InvalidArgument` (bad name, binding or authority
    /// key; a secret over [`MAX_SECRET`], caught here), `PermissionDenied` (the `seal`
    /// operation), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, SealOptions};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let info = client.seal("disk", b"hunter2", &SealOptions::new()).await?;
    /// println!("sealed to {}", info.pcrs);
    /// let secret = client.unseal("disk", None).await?;
    /// assert_eq!(secret.as_slice(), b"hunter2");
    /// # Ok(()) }
    /// ```
    pub async fn seal(&self, name: &str, secret: &[u8], options: &SealOptions) -> Result<SealInfo, Error> {
        if secret.len() > MAX_SECRET {
            return Err(Error::InvalidInput(format!(
                "the secret has {} bytes, more than the {MAX_SECRET} the vault seals",
                secret.len()
            )));
        }
        let request = self.request(options.to_request(name, secret));
        let info = self.sealing.clone().seal(request).await?;
        Ok(info.into_inner().into())
    }

    /// Unseals a secret. Secrets sealed with a policy authority need a [`SignedPolicy`]
    /// approving the current PCR values (its encoded bytes, as in a `--policy` file).
    ///
    /// # Errors
    /// `NotFound`, `FailedPrecondition` naming the PCRs that differ, `InvalidArgument` (a
    /// policy is missing or malformed), `PermissionDenied` (the `unseal` operation, or a policy
    /// signed by another authority, expired or revoked), `Unavailable`.
    pub async fn unseal(&self, name: &str, signed_policy: Option<&[u8]>) -> Result<Zeroizing<Vec<u8>>, Error> {
        let request = self.request(proto::UnsealRequest {
            name: name.to_owned(),
            signed_policy: signed_policy.map(<[u8]>::to_vec).unwrap_or_default(),
        });
        let response = self.sealing.clone().unseal(request).await?;
        Ok(response.into_inner().secret)
    }

    /// Deletes a sealed secret.
    ///
    /// # Errors
    /// `NotFound`, `PermissionDenied` (the `seal` operation), `Unavailable`.
    pub async fn delete_sealed(&self, name: &str) -> Result<(), Error> {
        let request = self.request(proto::DeleteSealedRequest { name: name.to_owned() });
        self.sealing.clone().delete_sealed(request).await?;
        Ok(())
    }

    /// Approves PCR values with a vault ECC P-256 key acting as policy authority; the result
    /// is the same as [`PolicyAuthority::sign`](crate::PolicyAuthority::sign) with an offline
    /// key.
    ///
    /// # Errors
    /// `NotFound` (no such key), `InvalidArgument` (not an ecc-p256 key), `PermissionDenied`
    /// (the `sign` operation on that key), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, PcrBinding, PolicyApproval};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let next: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse()?;
    /// let policy = client.sign_policy("fleet-authority", &PolicyApproval::new(&next)?.with_version(7)).await?;
    /// std::fs::write("next-kernel.policy", policy.to_bytes()).ok();
    /// # Ok(()) }
    /// ```
    pub async fn sign_policy(&self, key_name: &str, approval: &PolicyApproval) -> Result<SignedPolicy, Error> {
        let request = self.request(approval.to_request(key_name));
        let policy = self.sealing.clone().sign_policy(request).await?;
        Ok(policy.into_inner().into())
    }
}
