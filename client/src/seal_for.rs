//! Secrets for a fleet: the device's storage root key (`srk_public`, certified by the AK with
//! `certify_srk`), sealing for a device offline ([`seal_for`]: no daemon, no TPM), and importing
//! the result on the device (`import_sealed`). The blob format and the duplication live in
//! [`tpm_vault_proto::sealed_blob`], shared with the daemon.

use tpm_vault_proto::policy_digest::{ALG_SHA1, ALG_SHA256, ALG_SHA384};
use tpm_vault_proto::sealed_blob::{self, BlobPolicy, SealedBlob, StorageKey};
use tpm_vault_proto::v1 as proto;

use crate::attest::AkAlg;
use crate::{Client, Error, PcrBinding, SealInfo};

pub use tpm_vault_proto::sealed_blob::{MAX_BLOB, MAX_DIRECT};

/// The device's storage root key as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrkPublic {
    /// `TPM2B_PUBLIC` (what `seal-for --srk` takes; `tpm2_readpublic -o` writes the same).
    pub tpm2b_public: Vec<u8>,
    /// DER SubjectPublicKeyInfo.
    pub public_der: Vec<u8>,
    /// PEM SubjectPublicKeyInfo.
    pub public_pem: String,
    /// TPM name (nameAlg || H(TPMT_PUBLIC)).
    pub name: Vec<u8>,
}

/// A certification of the SRK by the AK (TPM2_Certify).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrkCertification {
    /// TPMS_ATTEST (type certify).
    pub attest: Vec<u8>,
    /// TPMT_SIGNATURE by the AK.
    pub signature: Vec<u8>,
    /// The SRK's `TPM2B_PUBLIC`.
    pub srk_tpm2b_public: Vec<u8>,
    /// AK public key, DER SubjectPublicKeyInfo.
    pub ak_public_der: Vec<u8>,
}

/// What a secret sealed for a device is bound to.
#[derive(Debug, Clone)]
pub enum SealForPolicy {
    /// These PCRs at these values (values required: the device is not here to read them).
    Pcr(PcrBinding),
    /// Any values of these PCRs (indices only) that this ECC P-256 authority (PEM or DER
    /// SubjectPublicKeyInfo) approves.
    Authorized {
        /// PCRs the approvals cover.
        pcrs: PcrBinding,
        /// The authority's public key.
        authority: Vec<u8>,
    },
}

fn bank_alg(bank: &str) -> Result<u16, Error> {
    match bank {
        "sha1" => Ok(ALG_SHA1),
        "sha256" => Ok(ALG_SHA256),
        "sha384" => Ok(ALG_SHA384),
        other => Err(Error::InvalidInput(format!("unsupported PCR bank {other:?}"))),
    }
}

fn indices(binding: &PcrBinding) -> Result<Vec<u8>, Error> {
    binding
        .pcrs()
        .iter()
        .map(|&p| u8::try_from(p).map_err(|_| Error::InvalidInput(format!("PCR {p} out of range"))))
        .collect()
}

impl SealForPolicy {
    fn to_blob_policy(&self) -> Result<BlobPolicy, Error> {
        match self {
            Self::Pcr(binding) => {
                if binding.values().is_empty() {
                    return Err(Error::InvalidInput(
                        "seal-for needs the PCR values the device must have (e.g. --pcr sha256:9=HEX): it cannot \
                         read the device's PCRs"
                            .into(),
                    ));
                }
                let mut pairs: Vec<(u8, Vec<u8>)> =
                    indices(binding)?.into_iter().zip(binding.values().iter().cloned()).collect();
                pairs.sort_by_key(|(p, _)| *p);
                let (pcrs, values) = pairs.into_iter().unzip();
                Ok(BlobPolicy::Pcr { bank: bank_alg(binding.bank())?, pcrs, values })
            }
            Self::Authorized { pcrs, authority } => {
                let mut list = indices(pcrs)?;
                list.sort_unstable();
                let authority_spki = sealed_blob::spki_p256_point(authority)
                    .and_then(|p| p256::PublicKey::from_sec1_bytes(&p).ok())
                    .and_then(|k| p256::pkcs8::EncodePublicKey::to_public_key_der(&k).ok())
                    .ok_or_else(|| {
                        Error::InvalidInput("policy authority must be an ECC P-256 public key (PEM or DER)".into())
                    })?;
                Ok(BlobPolicy::Authorized {
                    bank: bank_alg(pcrs.bank())?,
                    pcrs: list,
                    authority_spki: authority_spki.as_bytes().to_vec(),
                })
            }
        }
    }
}

/// The storage key in `srk`: a `TPM2B_PUBLIC` or `TPMT_PUBLIC` (`tpm-vault srk public --format
/// tpm2b`, `tpm2_readpublic -o`), or a PEM/DER P-256 public key taken as the TCG-template SRK.
///
/// # Errors
/// [`Error::InvalidInput`] naming why it is not a storage key.
pub fn storage_key(srk: &[u8]) -> Result<StorageKey, Error> {
    let text = std::str::from_utf8(srk).ok().filter(|t| t.contains("-----BEGIN"));
    let parsed = match text {
        Some(_) => StorageKey::from_spki_as_tcg_srk(srk),
        None => StorageKey::from_public(srk).or_else(|e| StorageKey::from_spki_as_tcg_srk(srk).map_err(|_| e)),
    };
    parsed.map_err(|e| Error::InvalidInput(format!("--srk: {e}")))
}

/// Seals `secret` for the device whose storage root key is `srk` (see [`storage_key`]) under
/// `policy`, as `name`; returns the blob `seal import` takes on that device. Offline: no
/// daemon, no TPM.
///
/// # Errors
/// [`Error::InvalidInput`] for a key that is not a storage key, a policy that cannot be
/// computed, an empty or oversize secret.
pub fn seal_for(srk: &[u8], name: &str, policy: &SealForPolicy, secret: &[u8]) -> Result<Vec<u8>, Error> {
    let valid = name.len() <= 64
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(Error::InvalidInput(format!("bad secret name {name:?}: use [a-z0-9][a-z0-9._-]{{0,63}}")));
    }
    let parent = storage_key(srk)?;
    let blob = sealed_blob::seal_for(&parent, name, policy.to_blob_policy()?, secret)
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    blob.to_bytes().map_err(|e| Error::InvalidInput(e.to_string()))
}

/// A blob from a raw import triple made by other tools (tpm2-pytss `utils.wrap`, go-tpm-tools):
/// the sealed object's `TPM2B_PUBLIC` (or `TPMT_PUBLIC`), the duplicate (`TPM2B_PRIVATE`) and
/// the encrypted seed (`TPM2B_ENCRYPTED_SECRET`), and the policy its authPolicy is.
///
/// # Errors
/// [`Error::InvalidInput`] when a part does not parse or the policy cannot be computed.
pub fn blob_from_triple(
    public: &[u8],
    duplicate: &[u8],
    seed: &[u8],
    policy: &SealForPolicy,
) -> Result<Vec<u8>, Error> {
    let strip = |b: &[u8], what: &str| -> Result<Vec<u8>, Error> {
        match b.split_first_chunk::<2>() {
            Some((n, rest)) if usize::from(u16::from_be_bytes(*n)) == rest.len() => Ok(rest.to_vec()),
            _ if what == "public" => Ok(b.to_vec()),
            _ => Err(Error::InvalidInput(format!("{what}: not a TPM2B (size-prefixed) structure"))),
        }
    };
    let blob = SealedBlob {
        name: String::new(),
        policy: policy.to_blob_policy()?,
        public: strip(public, "public")?,
        duplicate: strip(duplicate, "duplicate")?,
        encrypted_seed: strip(seed, "encrypted seed")?,
        payload: None,
    };
    blob.to_bytes().map_err(|e| Error::InvalidInput(e.to_string()))
}

impl Client {
    /// The device's storage root key.
    ///
    /// # Errors
    /// `PermissionDenied` (the `public` operation), `Unavailable`.
    pub async fn srk_public(&self) -> Result<SrkPublic, Error> {
        let request = self.request(proto::GetSrkPublicRequest {});
        let r = self.attestation.clone().get_srk_public(request).await?.into_inner();
        Ok(SrkPublic { tpm2b_public: r.tpm2b_public, public_der: r.public_der, public_pem: r.public_pem, name: r.name })
    }

    /// The AK certifies the SRK over `nonce` (TPM2_Certify).
    ///
    /// # Errors
    /// `InvalidArgument` (nonce size), `PermissionDenied` (the `quote` operation), `Unavailable`.
    pub async fn certify_srk(&self, nonce: &[u8]) -> Result<SrkCertification, Error> {
        self.certify_srk_with(AkAlg::EccP256, nonce).await
    }

    /// The attestation key `alg` certifies the SRK over `nonce` (TPM2_Certify): `Rsa2048` for a
    /// verifier that knows the device's RSA AK (a Keylime registrar's `aik_tpm`).
    ///
    /// # Errors
    /// `InvalidArgument` (nonce size), `PermissionDenied` (the `quote` operation), `Unavailable`.
    pub async fn certify_srk_with(&self, alg: AkAlg, nonce: &[u8]) -> Result<SrkCertification, Error> {
        let request = self.request(proto::CertifySrkRequest { nonce: nonce.to_vec(), ak_alg: alg.as_str().to_owned() });
        let r = self.attestation.clone().certify_srk(request).await?.into_inner();
        Ok(SrkCertification {
            attest: r.attest,
            signature: r.signature,
            srk_tpm2b_public: r.srk_tpm2b_public,
            ak_public_der: r.ak_public_der,
        })
    }

    /// Imports a sealed blob (from [`seal_for`] or [`blob_from_triple`]) as the sealed secret
    /// `name`, which `unseal` then opens like any other.
    ///
    /// # Errors
    /// `AlreadyExists`, `InvalidArgument` (a malformed blob, one made for another TPM or
    /// altered), `PermissionDenied` (the `seal` operation), `Unavailable`.
    pub async fn import_sealed(&self, name: &str, blob: &[u8]) -> Result<SealInfo, Error> {
        let request = self.request(proto::ImportSealedRequest { name: name.to_owned(), blob: blob.to_vec() });
        Ok(self.sealing.clone().import_sealed(request).await?.into_inner().into())
    }
}
