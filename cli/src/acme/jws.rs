//! The ACME account key in the vault: its JWK and thumbprint, and the JWS signatures of
//! every request, made in the TPM.
//!
//! instant-acme 0.8 (the newest release) signs requests only with a software key of its own;
//! its upstream `SigningKey` trait is not released yet. So the crate is given a throwaway
//! software key and an HTTP client of ours ([`VaultSigned`]) that, for each POST, replaces that
//! key's part of the flattened JWS (RFC 7515): the `jwk` of the protected header becomes the
//! vault key's, the signature is made by the vault (ES256: ECDSA P-256 with SHA-256 in the TPM,
//! returned as DER and re-encoded as the 64-byte `r || s` of RFC 7518), and an External Account
//! Binding is re-made over the vault key's JWK. Everything else (directory, nonces, orders,
//! authorizations, polling, problem documents) stays the crate's. Since it re-signs anyway, it
//! also answers `badNonce` with the fresh nonce of the rejection, up to [`NONCE_RETRIES`]
//! times: the crate alone gives up after two.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use base64::prelude::{Engine as _, BASE64_URL_SAFE_NO_PAD};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use p256::pkcs8::DecodePublicKey as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use tpm_vault_client::{Client, Error, HashAlgorithm, KeyAlgorithm, SignInput, SignOptions, SignatureScheme};

/// How often one request is re-sent after `badNonce` (RFC 8555 section 6.5: clients retry).
pub(crate) const NONCE_RETRIES: usize = 20;

/// The ACME account key: a vault ECDSA P-256 key.
#[derive(Clone, Debug)]
pub(crate) struct AccountKey {
    client: Client,
    name: String,
    public: EcJwk,
}

/// A P-256 public key as JWK members: base64url of the point's coordinates.
#[derive(Clone, Debug, PartialEq, Eq)]
struct EcJwk {
    x: String,
    y: String,
}

impl EcJwk {
    /// The JWK (RFC 7517).
    fn jwk(&self) -> Value {
        json!({ "crv": "P-256", "kty": "EC", "x": self.x, "y": self.y })
    }

    /// The RFC 7638 thumbprint: SHA-256 over the required members in lexical order, base64url.
    fn thumbprint(&self) -> String {
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#, self.x, self.y);
        BASE64_URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
    }
}

impl AccountKey {
    /// The vault key `name`, which must be ECDSA P-256 (ES256).
    pub(crate) async fn load(client: &Client, name: &str) -> Result<AccountKey, Error> {
        let public = client.public_key(name).await?;
        if public.algorithm != KeyAlgorithm::EccP256 {
            return Err(Error::InvalidInput(format!(
                "ACME account key {name} must be ecc-p256 (ES256); it is {}",
                tpm_vault_client::Named::name(public.algorithm)
            )));
        }
        let key = p256::PublicKey::from_public_key_der(&public.der)
            .map_err(|e| Error::InvalidInput(format!("public key of {name}: {e}")))?;
        let point = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key, false);
        let (Some(x), Some(y)) = (point.x(), point.y()) else {
            return Err(Error::InvalidInput(format!("public key of {name} is the identity")));
        };
        Ok(AccountKey {
            client: client.clone(),
            name: name.to_owned(),
            public: EcJwk { x: BASE64_URL_SAFE_NO_PAD.encode(x), y: BASE64_URL_SAFE_NO_PAD.encode(y) },
        })
    }

    /// The vault key's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The public key as a JWK (RFC 7517).
    pub(crate) fn jwk(&self) -> Value {
        self.public.jwk()
    }

    /// The key authorization of a challenge token (RFC 8555 section 8.1).
    pub(crate) fn key_authorization(&self, token: &str) -> String {
        format!("{token}.{}", self.public.thumbprint())
    }

    /// A flattened JWS of `payload_b64` under `protected`, signed in the TPM.
    async fn sign(&self, protected: &Value, payload_b64: &str) -> Result<Value, Error> {
        let protected_b64 = BASE64_URL_SAFE_NO_PAD.encode(protected.to_string());
        let input = format!("{protected_b64}.{payload_b64}");
        let options = SignOptions::new().with_hash(HashAlgorithm::Sha256).with_scheme(SignatureScheme::Ecdsa);
        let signature = self.client.sign(&self.name, SignInput::Message(input.into_bytes()), &options).await?;
        let raw = p256::ecdsa::Signature::from_der(signature.bytes())
            .map_err(|e| Error::InvalidInput(format!("signature of {}: {e}", self.name)))?;
        Ok(json!({
            "protected": protected_b64,
            "payload": payload_b64,
            "signature": BASE64_URL_SAFE_NO_PAD.encode(raw.to_bytes()),
        }))
    }
}

/// An External Account Binding key (RFC 8555 section 7.3.4), from `--eab-kid` and
/// `--eab-hmac-file`.
pub(crate) struct EabKey {
    pub(crate) kid: String,
    pub(crate) hmac: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for EabKey {
    /// Shows the key id only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EabKey").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl EabKey {
    /// The binding's JWS over `jwk`, for the `newAccount` request to `url`.
    fn bind(&self, jwk: &Value, url: &str) -> Value {
        let protected =
            BASE64_URL_SAFE_NO_PAD.encode(json!({ "alg": "HS256", "kid": self.kid, "url": url }).to_string());
        let payload = BASE64_URL_SAFE_NO_PAD.encode(jwk.to_string());
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &self.hmac);
        let tag = aws_lc_rs::hmac::sign(&key, format!("{protected}.{payload}").as_bytes());
        json!({ "protected": protected, "payload": payload, "signature": BASE64_URL_SAFE_NO_PAD.encode(tag.as_ref()) })
    }
}

/// What the last problem response said beyond its document: the `Retry-After` header.
#[derive(Debug, Default)]
pub(crate) struct LastProblem {
    pub(crate) retry_after: Option<String>,
}

/// An [`HttpClient`] that re-signs instant-acme's POST requests with the vault account key
/// (see the module docs), over `inner`.
pub(crate) struct VaultSigned {
    inner: Arc<dyn HttpClient>,
    key: AccountKey,
    eab: Option<Arc<EabKey>>,
    last: Arc<Mutex<LastProblem>>,
}

impl VaultSigned {
    pub(crate) fn new(
        inner: Arc<dyn HttpClient>,
        key: AccountKey,
        eab: Option<EabKey>,
        last: Arc<Mutex<LastProblem>>,
    ) -> VaultSigned {
        VaultSigned { inner, key, eab: eab.map(Arc::new), last }
    }
}

impl HttpClient for VaultSigned {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let (inner, key, eab, last) = (self.inner.clone(), self.key.clone(), self.eab.clone(), self.last.clone());
        Box::pin(async move {
            if req.method() != Method::POST {
                return inner.request(req).await;
            }
            let (parts, body) = req.into_parts();
            let body = http_body_util::BodyExt::collect(body).await.map(|b| b.to_bytes()).unwrap_or_default();
            let jws: Value = serde_json::from_slice(&body)?;
            let (mut protected, mut payload_b64) = decode_jws(&jws)?;
            if protected.get("jwk").is_some() {
                protected["jwk"] = key.jwk();
                // newAccount: the binding must cover the vault key, not the crate's.
                if let (Some(eab), Some(url)) = (&eab, protected["url"].as_str().map(str::to_owned)) {
                    let mut payload: Value = serde_json::from_slice(&b64_decode(&payload_b64)?)?;
                    if payload.get("externalAccountBinding").is_some() {
                        payload["externalAccountBinding"] = eab.bind(&key.jwk(), &url);
                        payload_b64 = BASE64_URL_SAFE_NO_PAD.encode(payload.to_string());
                    }
                }
            }
            let mut attempt = 0;
            loop {
                let signed =
                    key.sign(&protected, &payload_b64).await.map_err(|e| instant_acme::Error::Other(e.into()))?;
                let request = Request::from_parts(parts.clone(), BodyWrapper::from(signed.to_string().into_bytes()));
                let response = inner.request(request).await?;
                if response.parts.status.is_success() || response.parts.status.is_redirection() {
                    return Ok(response);
                }
                let (parts_r, mut body_r) = (response.parts, response.body);
                let bytes = body_r.into_bytes().await.map_err(instant_acme::Error::Other)?;
                let problem: Option<Value> = serde_json::from_slice(&bytes).ok();
                let kind = problem.as_ref().and_then(|p| p["type"].as_str()).unwrap_or_default();
                let fresh = parts_r.headers.get("replay-nonce").and_then(|v| v.to_str().ok()).map(str::to_owned);
                if parts_r.status == StatusCode::BAD_REQUEST
                    && kind == "urn:ietf:params:acme:error:badNonce"
                    && attempt < NONCE_RETRIES
                {
                    if let Some(nonce) = fresh {
                        attempt += 1;
                        protected["nonce"] = Value::String(nonce);
                        continue;
                    }
                }
                if let Ok(mut last) = last.lock() {
                    last.retry_after =
                        parts_r.headers.get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_owned);
                }
                return Ok(BytesResponse { parts: parts_r, body: Box::new(bytes) });
            }
        })
    }
}

/// The protected header (decoded) and the payload (still base64url) of a flattened JWS.
fn decode_jws(jws: &Value) -> Result<(Value, String), instant_acme::Error> {
    let protected = jws["protected"].as_str().ok_or("JWS without a protected header")?;
    let payload = jws["payload"].as_str().ok_or("JWS without a payload")?;
    Ok((serde_json::from_slice(&b64_decode(protected)?)?, payload.to_owned()))
}

fn b64_decode(text: &str) -> Result<Vec<u8>, instant_acme::Error> {
    BASE64_URL_SAFE_NO_PAD.decode(text).map_err(|e| instant_acme::Error::Other(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprint_matches_rfc_7638_canonical_form() {
        // RFC 7638's method on a P-256 key: the canonical JSON has no spaces, members sorted.
        let x = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
        let y = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let expected = BASE64_URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()));
        let key = EcJwk { x: x.into(), y: y.into() };
        assert_eq!(key.thumbprint(), expected);
        assert_eq!(key.jwk()["kty"], "EC");
    }

    #[test]
    fn eab_binding_is_an_hs256_jws_over_the_jwk() {
        let eab = EabKey { kid: "kid-1".into(), hmac: Zeroizing::new(b"secret".to_vec()) };
        let jwk = json!({"kty": "EC"});
        let bound = eab.bind(&jwk, "https://ca/new-acct");
        let (protected, payload) = decode_jws(&bound).unwrap();
        assert_eq!(protected["alg"], "HS256");
        assert_eq!(protected["kid"], "kid-1");
        assert_eq!(b64_decode(&payload).unwrap(), jwk.to_string().into_bytes());
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"secret");
        let input = format!("{}.{}", bound["protected"].as_str().unwrap(), payload);
        let tag = b64_decode(bound["signature"].as_str().unwrap()).unwrap();
        assert!(aws_lc_rs::hmac::verify(&key, input.as_bytes(), &tag).is_ok());
    }
}
