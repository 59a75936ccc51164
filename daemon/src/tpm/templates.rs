//! TPM object templates: the TCG storage root key and the vault's signing keys.
//!
//! The SRK template is the TCG "EK Credential Profile / Provisioning Guidance" ECC P-256 storage
//! key with a `unique` of two 32-byte zero coordinates, so it is byte-identical to what tpm2-tools,
//! go-tpm and systemd derive. Signing keys use a NULL scheme so the caller picks the hash and
//! scheme per signature.

use tss_esapi::attributes::ObjectAttributesBuilder;
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::structures::{
    Digest, EccParameter, EccPoint, EccScheme, KeyDerivationFunctionScheme, KeyedHashScheme, Public, PublicBuilder,
    PublicEccParametersBuilder, PublicKeyRsa, PublicKeyedHashParameters, PublicRsaParametersBuilder, RsaExponent,
    RsaScheme, SymmetricDefinitionObject,
};

use tpm_vault_proto::algorithm::{Curve, TpmKey};

use super::error::{wrap, TpmError};
use crate::model::KeyAlg;

/// The well-known persistent handle of the SRK (TCG provisioning guidance).
pub const SRK_PERSISTENT_HANDLE: u32 = 0x8100_0001;

/// The TCG ECC P-256 SRK template.
///
/// # Errors
/// Only if tss-esapi rejects a constant template (a bug).
pub fn srk() -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_no_da(true)
        .with_restricted(true)
        .with_decrypt(true)
        .build()
        .map_err(wrap("SRK attributes"))?;
    let zero = EccParameter::try_from(vec![0u8; 32]).map_err(wrap("SRK unique"))?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new_restricted_decryption_key(
                SymmetricDefinitionObject::AES_128_CFB,
                EccCurve::NistP256,
            )
            .build()
            .map_err(wrap("SRK parameters"))?,
        )
        .with_ecc_unique_identifier(EccPoint::new(zero.clone(), zero))
        .build()
        .map_err(wrap("SRK template"))
}

/// Template for a non-extractable signing key: fixedTPM | fixedParent | sensitiveDataOrigin |
/// userWithAuth | sign, NULL scheme. `auth_policy` is set for PCR-bound keys. For a hybrid key
/// this is its ECDSA P-256 half.
///
/// `has_password`: only a key with a password is under the TPM's dictionary-attack protection.
/// Every other key gets noDA: it has nothing to guess, and without noDA a lockout (caused by
/// anyone guessing *another* key's password) would also stop it, the TLS server's key included.
///
/// # Errors
/// [`TpmError::Malformed`] for ML-DSA and ML-KEM, which have no TPM key (their TPM object is a
/// [`sealed`] one); otherwise only if tss-esapi rejects the template (a bug).
pub fn signing_key(alg: KeyAlg, auth_policy: Option<Digest>, has_password: bool) -> Result<Public, TpmError> {
    let key = alg.tpm_key().ok_or_else(|| TpmError::Malformed(format!("{alg} keys have no TPM key template")))?;
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_no_da(!has_password)
        .with_user_with_auth(auth_policy.is_none())
        .with_sign_encrypt(true)
        .build()
        .map_err(wrap("key attributes"))?;
    let builder = PublicBuilder::new()
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_auth_policy(auth_policy.unwrap_or_default());
    let builder = match key {
        TpmKey::Ecc(curve) => {
            let curve = match curve {
                Curve::NistP256 => EccCurve::NistP256,
                Curve::NistP384 => EccCurve::NistP384,
            };
            builder
                .with_public_algorithm(PublicAlgorithm::Ecc)
                .with_ecc_parameters(
                    PublicEccParametersBuilder::new()
                        .with_symmetric(SymmetricDefinitionObject::Null)
                        .with_ecc_scheme(EccScheme::Null)
                        .with_curve(curve)
                        .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                        // The builder only allows a NULL scheme when it is not told the key signs; the
                        // `sign` object attribute above is what the TPM enforces.
                        .with_is_signing_key(false)
                        .with_is_decryption_key(false)
                        .with_restricted(false)
                        .build()
                        .map_err(wrap("ECC parameters"))?,
                )
                .with_ecc_unique_identifier(EccPoint::default())
        }
        TpmKey::Rsa { bits } => {
            let bits = RsaKeyBits::try_from(bits).map_err(wrap("RSA key size"))?;
            builder
                .with_public_algorithm(PublicAlgorithm::Rsa)
                .with_rsa_parameters(
                    PublicRsaParametersBuilder::new()
                        .with_symmetric(SymmetricDefinitionObject::Null)
                        .with_scheme(RsaScheme::Null)
                        .with_key_bits(bits)
                        .with_exponent(RsaExponent::default())
                        // The builder only allows a NULL scheme when it is not told the key signs; the
                        // `sign` object attribute above is what the TPM enforces.
                        .with_is_signing_key(false)
                        .with_is_decryption_key(false)
                        .with_restricted(false)
                        .build()
                        .map_err(wrap("RSA parameters"))?,
                )
                .with_rsa_unique_identifier(PublicKeyRsa::default())
        }
    };
    builder.build().map_err(wrap("key template"))
}

/// Template for a sealed data object: the TPM stores caller-supplied data (a 256-bit key) that
/// only a policy session satisfying `auth_policy` can unseal. No password (userWithAuth clear),
/// so noDA is safe: there is nothing to guess and no dictionary-attack tries to burn.
///
/// # Errors
/// Only if tss-esapi rejects the template (a bug).
pub fn sealed(auth_policy: Digest) -> Result<Public, TpmError> {
    sealed_object(auth_policy, false)
}

/// Template for a sealed data object with no policy: opens with its (empty) auth value through
/// an encrypted HMAC session. noDA: there is no password to guess.
///
/// # Errors
/// Only if tss-esapi rejects the template (a bug).
pub fn sealed_unbound() -> Result<Public, TpmError> {
    sealed_object(Digest::default(), true)
}

fn sealed_object(auth_policy: Digest, user_with_auth: bool) -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_no_da(true)
        .with_user_with_auth(user_with_auth)
        .with_admin_with_policy(!user_with_auth)
        .build()
        .map_err(wrap("sealed attributes"))?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::KeyedHash)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_auth_policy(auth_policy)
        .with_keyed_hash_parameters(PublicKeyedHashParameters::new(KeyedHashScheme::Null))
        .with_keyed_hash_unique_identifier(Digest::default())
        .build()
        .map_err(wrap("sealed template"))
}

/// The public area of an external ECC P-256 verification key (a policy authority), as
/// `TPM2_LoadExternal` takes it.
///
/// # Errors
/// Only if tss-esapi rejects the template (a bug) or the coordinates are malformed.
pub fn external_p256(x: &[u8], y: &[u8]) -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_user_with_auth(true)
        .with_sign_encrypt(true)
        .build()
        .map_err(wrap("authority attributes"))?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new()
                .with_symmetric(SymmetricDefinitionObject::Null)
                .with_ecc_scheme(EccScheme::EcDsa(tss_esapi::structures::HashScheme::new(HashingAlgorithm::Sha256)))
                .with_curve(EccCurve::NistP256)
                .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(false)
                .build()
                .map_err(wrap("authority parameters"))?,
        )
        .with_ecc_unique_identifier(EccPoint::new(
            EccParameter::try_from(x.to_vec()).map_err(wrap("authority x"))?,
            EccParameter::try_from(y.to_vec()).map_err(wrap("authority y"))?,
        ))
        .build()
        .map_err(wrap("authority template"))
}

/// Template for the attestation key: a restricted ECC P-256 signing key with the ECDSA-SHA256
/// scheme fixed (a restricted key only signs TPM-generated structures such as quotes, or
/// digests the TPM itself hashed).
///
/// # Errors
/// Only if tss-esapi rejects the template (a bug).
pub fn attestation_key() -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()
        .map_err(wrap("AK attributes"))?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new()
                .with_symmetric(SymmetricDefinitionObject::Null)
                .with_ecc_scheme(EccScheme::EcDsa(tss_esapi::structures::HashScheme::new(HashingAlgorithm::Sha256)))
                .with_curve(EccCurve::NistP256)
                .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(true)
                .build()
                .map_err(wrap("AK parameters"))?,
        )
        .with_ecc_unique_identifier(EccPoint::default())
        .build()
        .map_err(wrap("AK template"))
}

/// Template for the RSA attestation key: a restricted RSA 2048 signing key with the
/// RSASSA-SHA256 scheme fixed, the key type Keylime's verifier expects by default (its
/// proof-of-possession check and its tenant's `accept_tpm_signing_algs` default both name
/// `rsassa`). Created only when a caller asks for it (`tpm-vault keylime-agent`).
///
/// # Errors
/// Only if tss-esapi rejects the template (a bug).
pub fn attestation_key_rsa() -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()
        .map_err(wrap("RSA AK attributes"))?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Rsa)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_rsa_parameters(
            PublicRsaParametersBuilder::new()
                .with_symmetric(SymmetricDefinitionObject::Null)
                .with_scheme(RsaScheme::RsaSsa(tss_esapi::structures::HashScheme::new(HashingAlgorithm::Sha256)))
                .with_key_bits(RsaKeyBits::Rsa2048)
                .with_exponent(RsaExponent::default())
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(true)
                .build()
                .map_err(wrap("RSA AK parameters"))?,
        )
        .with_rsa_unique_identifier(PublicKeyRsa::default())
        .build()
        .map_err(wrap("RSA AK template"))
}
