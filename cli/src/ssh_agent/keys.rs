//! Conversions between the vault's formats (DER SubjectPublicKeyInfo, DER `ECDSA-Sig-Value`,
//! raw RSA signatures) and OpenSSH's (`ssh-key` key blobs and signatures), and the choice of
//! hash and scheme for an agent sign request. No I/O.

use ssh_agent_lib::ssh_key::public::{EcdsaPublicKey, KeyData, RsaPublicKey};
use ssh_agent_lib::ssh_key::{Algorithm, HashAlg, Signature};

use tpm_vault_client::{HashAlgorithm, KeyAlgorithm, SignOptions, SignatureScheme};
use tpm_vault_proto::algorithm::{Curve, TpmKey};

/// `SSH_AGENT_RSA_SHA2_256`: the client wants an `rsa-sha2-256` signature.
pub const SSH_AGENT_RSA_SHA2_256: u32 = 0x02;
/// `SSH_AGENT_RSA_SHA2_512`: the client wants an `rsa-sha2-512` signature.
pub const SSH_AGENT_RSA_SHA2_512: u32 = 0x04;

/// Why a key or a signature cannot be used over the agent protocol.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFormatError {
    /// The vault key's algorithm has no OpenSSH form here (ML-DSA, ML-KEM, hybrid).
    #[error("algorithm {0:?} is not served over the SSH agent protocol")]
    Unsupported(KeyAlgorithm),
    /// The public key or signature from the daemon does not parse.
    #[error("malformed {0} from the daemon")]
    Malformed(&'static str),
    /// An RSA request without `rsa-sha2-256`/`rsa-sha2-512` (SHA-1 `ssh-rsa`), not allowed.
    #[error("SHA-1 ssh-rsa signatures are disabled (use rsa-sha2-256/512, or --allow-ssh-rsa-sha1)")]
    Sha1Refused,
}

/// The OpenSSH key blob of a vault public key (DER SubjectPublicKeyInfo).
///
/// # Errors
/// [`KeyFormatError::Unsupported`] for keys without an OpenSSH form, [`KeyFormatError::Malformed`].
pub fn key_data(algorithm: KeyAlgorithm, spki_der: &[u8]) -> Result<KeyData, KeyFormatError> {
    use p256::pkcs8::DecodePublicKey as _;
    let bad = || KeyFormatError::Malformed("public key");
    let info = algorithm.info().filter(|a| a.ssh_key_type.is_some());
    match info.and_then(|a| a.tpm_key) {
        Some(TpmKey::Ecc(curve)) => {
            let point = match curve {
                Curve::NistP256 => {
                    let key = p256::PublicKey::from_public_key_der(spki_der).map_err(|_| bad())?;
                    p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key, false).to_bytes()
                }
                Curve::NistP384 => {
                    let key = p384::PublicKey::from_public_key_der(spki_der).map_err(|_| bad())?;
                    p384::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key, false).to_bytes()
                }
            };
            Ok(KeyData::Ecdsa(EcdsaPublicKey::from_sec1_bytes(&point).map_err(|_| bad())?))
        }
        Some(TpmKey::Rsa { .. }) => {
            let key = rsa::RsaPublicKey::from_public_key_der(spki_der).map_err(|_| bad())?;
            Ok(KeyData::Rsa(RsaPublicKey::try_from(&key).map_err(|_| bad())?))
        }
        None => Err(KeyFormatError::Unsupported(algorithm)),
    }
}

/// How to sign an agent request with a key of `algorithm`: the vault's sign options and the
/// SSH signature algorithm of the answer. `flags` are the request's flags; `allow_sha1`
/// permits `ssh-rsa` (SHA-1) when the client asks for neither SHA-2 flag.
///
/// # Errors
/// [`KeyFormatError::Unsupported`], [`KeyFormatError::Sha1Refused`].
pub fn sign_plan(
    algorithm: KeyAlgorithm,
    flags: u32,
    allow_sha1: bool,
) -> Result<(SignOptions, Algorithm), KeyFormatError> {
    let options = SignOptions::new();
    let info = algorithm.info().filter(|a| a.ssh_key_type.is_some());
    Ok(match info.and_then(|a| a.tpm_key) {
        Some(TpmKey::Ecc(curve)) => (
            options.with_hash(curve.hash()).with_scheme(SignatureScheme::Ecdsa),
            Algorithm::Ecdsa {
                curve: match curve {
                    Curve::NistP256 => ssh_agent_lib::ssh_key::EcdsaCurve::NistP256,
                    Curve::NistP384 => ssh_agent_lib::ssh_key::EcdsaCurve::NistP384,
                },
            },
        ),
        Some(TpmKey::Rsa { .. }) => {
            let (hash, ssh_hash) = if flags & SSH_AGENT_RSA_SHA2_512 != 0 {
                (HashAlgorithm::Sha512, Some(HashAlg::Sha512))
            } else if flags & SSH_AGENT_RSA_SHA2_256 != 0 {
                (HashAlgorithm::Sha256, Some(HashAlg::Sha256))
            } else if allow_sha1 {
                (HashAlgorithm::Sha1, None)
            } else {
                return Err(KeyFormatError::Sha1Refused);
            };
            (options.with_hash(hash).with_scheme(SignatureScheme::RsaPkcs1), Algorithm::Rsa { hash: ssh_hash })
        }
        None => return Err(KeyFormatError::Unsupported(algorithm)),
    })
}

/// The SSH signature for the vault's signature `bytes` (DER `ECDSA-Sig-Value` for ECDSA, the
/// raw signature for RSA), of SSH algorithm `algorithm` (from [`sign_plan`]).
///
/// # Errors
/// [`KeyFormatError::Malformed`].
pub fn ssh_signature(algorithm: Algorithm, bytes: &[u8]) -> Result<Signature, KeyFormatError> {
    use ssh_agent_lib::ssh_key::EcdsaCurve;
    let bad = || KeyFormatError::Malformed("signature");
    match algorithm {
        Algorithm::Ecdsa { curve: EcdsaCurve::NistP256 } => {
            let sig = p256::ecdsa::Signature::from_der(bytes).map_err(|_| bad())?;
            Signature::try_from(sig).map_err(|_| bad())
        }
        Algorithm::Ecdsa { curve: EcdsaCurve::NistP384 } => {
            let sig = p384::ecdsa::Signature::from_der(bytes).map_err(|_| bad())?;
            Signature::try_from(sig).map_err(|_| bad())
        }
        rsa @ Algorithm::Rsa { .. } => Signature::new(rsa, bytes.to_vec()).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// Whether `name` matches the shell-style `glob` (`*` any run, `?` one character).
pub fn glob_match(glob: &str, name: &str) -> bool {
    let (g, n): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    // Iterative matcher with one backtrack point for the last `*`.
    let (mut gi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ni;
            gi += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", "web"));
        assert!(glob_match("web-*", "web-1"));
        assert!(!glob_match("web-*", "db"));
        assert!(glob_match("h?st*", "host-key"));
        assert!(glob_match("*-key", "host-key"));
        assert!(!glob_match("", "a"));
    }

    #[test]
    fn rsa_without_sha2_flags_needs_permission() {
        assert!(matches!(sign_plan(KeyAlgorithm::Rsa2048, 0, false), Err(KeyFormatError::Sha1Refused)));
        let (opts, alg) = sign_plan(KeyAlgorithm::Rsa2048, SSH_AGENT_RSA_SHA2_512, false).unwrap();
        assert_eq!(opts.hash(), HashAlgorithm::Sha512);
        assert_eq!(alg.as_str(), "rsa-sha2-512");
        let (opts, alg) = sign_plan(KeyAlgorithm::Rsa3072, 0, true).unwrap();
        assert_eq!(opts.hash(), HashAlgorithm::Sha1);
        assert_eq!(alg.as_str(), "ssh-rsa");
        assert!(sign_plan(KeyAlgorithm::MlDsa65, 0, false).is_err());
    }

    #[test]
    fn ecdsa_signature_from_der() {
        use p256::ecdsa::signature::Signer as _;
        let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let sig: p256::ecdsa::Signature = key.sign(b"m");
        let der = sig.to_der();
        let (_, alg) = sign_plan(KeyAlgorithm::EccP256, 0, false).unwrap();
        let ssh = ssh_signature(alg, der.as_bytes()).unwrap();
        assert_eq!(ssh.algorithm().as_str(), "ecdsa-sha2-nistp256");
        assert!(
            ssh_signature(Algorithm::Ecdsa { curve: ssh_agent_lib::ssh_key::EcdsaCurve::NistP256 }, b"junk").is_err()
        );
    }
}
