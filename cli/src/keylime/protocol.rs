//! The JSON messages of Keylime's registrar (API v3.0) and push-model verifier (JSON:API
//! documents), built and read as Keylime 7.14.3 does (`keylime/web/registrar`,
//! `keylime/web/verifier/{session,attestation}_controller.py`, `keylime/models/verifier`,
//! `keylime/verification/tpm_engine.py`). Pure functions: no I/O.

use base64::Engine as _;
use serde_json::{json, Value};

use super::KeylimeError;
use tpm_vault_client::attest::{encode_pcrs, AttestationKey, Certification, Quote};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Checks that `uuid` is a UUID in its text form (the registrar keys its records by it).
///
/// # Errors
/// [`KeylimeError::Config`] otherwise.
pub(crate) fn check_uuid(uuid: &str) -> Result<(), KeylimeError> {
    let groups: Vec<&str> = uuid.split('-').collect();
    let lengths = [8, 4, 4, 4, 12];
    let ok = groups.len() == 5
        && groups.iter().zip(lengths).all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(KeylimeError::Config(format!("agent UUID {uuid:?} is not a UUID (8-4-4-4-12 hex digits)")))
    }
}

/// `POST /v2.6/agents/{uuid}`: the EK (certificate and public area) and the AK's TPM2B_PUBLIC.
pub(crate) fn registration(keys: &AttestationKey) -> Value {
    let mut body = json!({
        "ek_tpm": b64(&keys.ek_tpm2b_public),
        "aik_tpm": b64(&keys.ak_tpm2b_public),
    });
    if let Some(cert) = &keys.ek_certificate {
        body["ekcert"] = Value::String(b64(cert));
    }
    body
}

/// The activation tag: hex HMAC-SHA384 of the UUID under the base64 text of the secret the
/// registrar encrypted to the EK (what `keylime.crypto.do_hmac` checks).
pub(crate) fn auth_tag(secret: &[u8], uuid: &str) -> String {
    let key_text = zeroize::Zeroizing::new(b64(secret));
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA384, key_text.as_bytes());
    hex::encode(aws_lc_rs::hmac::sign(&key, uuid.as_bytes()).as_ref())
}

/// `POST /v3.0/sessions`.
pub(crate) fn session_request(uuid: &str) -> Value {
    json!({ "data": { "type": "session", "attributes": {
        "agent_id": uuid,
        "authentication_supported": [ { "authentication_class": "pop", "authentication_type": "tpm_pop" } ],
    } } })
}

/// The session id and the decoded challenge of a session answer.
pub(crate) fn session_challenge(body: &Value) -> Result<(String, Vec<u8>), String> {
    let id = body.pointer("/data/id").and_then(Value::as_str).ok_or("no data.id")?;
    let challenge = body
        .pointer("/data/attributes/authentication_requested")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|m| m.get("authentication_type").and_then(Value::as_str) == Some("tpm_pop")))
        .and_then(|m| m.pointer("/chosen_parameters/challenge"))
        .and_then(Value::as_str)
        .ok_or("no tpm_pop challenge")?;
    let challenge =
        base64::engine::general_purpose::STANDARD.decode(challenge).map_err(|e| format!("challenge: {e}"))?;
    Ok((id.to_owned(), challenge))
}

/// `PATCH /v3.0/sessions/{id}`: the TPM2_Certify of the AK over the challenge.
pub(crate) fn session_proof(uuid: &str, proof: &Certification) -> Value {
    json!({ "data": { "type": "session", "attributes": {
        "agent_id": uuid,
        "authentication_provided": [ {
            "authentication_class": "pop",
            "authentication_type": "tpm_pop",
            "data": { "message": b64(&proof.attest), "signature": b64(&proof.signature) },
        } ],
    } } })
}

/// The server's explanation of an error: JSON:API `errors[].detail`, or the registrar's
/// `status`.
pub(crate) fn error_detail(body: &Value) -> String {
    if let Some(errors) = body.get("errors").and_then(Value::as_array) {
        let details: Vec<String> = errors
            .iter()
            .filter_map(|e| e.get("detail").or_else(|| e.get("title")).and_then(Value::as_str).map(str::to_owned))
            .collect();
        if !details.is_empty() {
            return details.join("; ");
        }
    }
    body.get("status").and_then(Value::as_str).map(str::to_owned).unwrap_or_default()
}

/// `POST /v3.0/agents/{uuid}/attestations`: what this device can give (a quote with the RSA
/// AK over `pcrs` in the sha256 bank; the UEFI event log when there is one; never an IMA log).
pub(crate) fn capabilities(keys: &AttestationKey, pcrs: &[u32], uefi_log: bool, boot_time: String) -> Value {
    let mut supported = vec![json!({
        "evidence_class": "certification",
        "evidence_type": "tpm_quote",
        "capabilities": {
            "component_version": "2.0",
            "evidence_version": "1.0",
            "signature_schemes": ["rsassa"],
            "hash_algorithms": ["sha256"],
            "available_subjects": { "sha256": pcrs },
            "certification_keys": [ {
                "key_class": "asymmetric",
                "key_algorithm": "rsa",
                "key_size": 2048,
                "server_identifier": "ak",
                "local_identifier": hex::encode(&keys.ak_name),
                "allowable_signature_schemes": ["rsassa"],
                "allowable_hash_algorithms": ["sha256"],
                "public": b64(&keys.ak_tpm2b_public),
            } ],
        },
    })];
    if uefi_log {
        supported.push(json!({
            "evidence_class": "log",
            "evidence_type": "uefi_log",
            "capabilities": {
                "evidence_version": "2.1",
                "supports_partial_access": false,
                "appendable": false,
                "formats": ["application/octet-stream"],
            },
        }));
    }
    json!({ "data": { "type": "attestation", "attributes": {
        "evidence_supported": supported,
        "system_info": { "boot_time": boot_time },
    } } })
}

/// The quote the verifier asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteRequest {
    /// The nonce (qualifying data), decoded.
    pub challenge: Vec<u8>,
    /// The sha256 PCRs to quote.
    pub pcrs: Vec<u32>,
}

/// What the verifier asked for in its answer to the capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceRequest {
    /// The attestation's index.
    pub index: String,
    /// The quote, if asked for.
    pub quote: Option<QuoteRequest>,
    /// Whether the UEFI event log was asked for.
    pub uefi_log: bool,
}

impl EvidenceRequest {
    /// Reads the `evidence_requested` of an attestation resource.
    ///
    /// # Errors
    /// What is missing or not as offered.
    pub fn parse(body: &Value) -> Result<EvidenceRequest, String> {
        let index = Self::parse_index(body).unwrap_or_else(|| "latest".into());
        Self::parse_items(body, index)
    }

    /// The attestation's index: `data.id`, or (Keylime 7.14.3 leaves `data.id` out) the last
    /// segment of `links.self`.
    pub fn parse_index(body: &Value) -> Option<String> {
        match body.pointer("/data/id") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => body
                .pointer("/data/links/self")
                .or_else(|| body.pointer("/links/self"))
                .and_then(Value::as_str)
                .and_then(|l| l.rsplit('/').next())
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        }
    }

    fn parse_items(body: &Value, index: String) -> Result<EvidenceRequest, String> {
        let items = body
            .pointer("/data/attributes/evidence_requested")
            .and_then(Value::as_array)
            .ok_or("no evidence_requested")?;
        let mut request = EvidenceRequest { index, quote: None, uefi_log: false };
        for item in items {
            match item.get("evidence_type").and_then(Value::as_str) {
                Some("tpm_quote") => {
                    let params = item.get("chosen_parameters").ok_or("tpm_quote without chosen_parameters")?;
                    let challenge = params.get("challenge").and_then(Value::as_str).ok_or("no challenge")?;
                    let challenge = base64::engine::general_purpose::STANDARD
                        .decode(challenge)
                        .map_err(|e| format!("challenge: {e}"))?;
                    if let Some(s) = params.get("signature_scheme").and_then(Value::as_str) {
                        if s != "rsassa" {
                            return Err(format!("signature scheme {s:?} was not offered"));
                        }
                    }
                    if let Some(h) = params.get("hash_algorithm").and_then(Value::as_str) {
                        if h != "sha256" {
                            return Err(format!("hash algorithm {h:?} was not offered"));
                        }
                    }
                    let pcrs = params
                        .pointer("/selected_subjects/sha256")
                        .and_then(Value::as_array)
                        .ok_or("no sha256 PCRs in selected_subjects")?
                        .iter()
                        .map(|v| v.as_u64().filter(|&p| p < 24).map(|p| p as u32).ok_or("a PCR index is not 0-23"))
                        .collect::<Result<Vec<u32>, _>>()?;
                    request.quote = Some(QuoteRequest { challenge, pcrs });
                }
                Some("uefi_log") => request.uefi_log = true,
                Some(other) => return Err(format!("evidence {other:?} was not offered")),
                None => return Err("an evidence item without evidence_type".into()),
            }
        }
        Ok(request)
    }
}

/// The `tpm_quote` evidence item: TPMS_ATTEST, TPMT_SIGNATURE and the PCR values in
/// tpm2-tools' `quote.pcrs` layout (what Keylime parses).
pub(crate) fn quote_evidence(quote: &Quote) -> Result<Value, String> {
    let pcrs = encode_pcrs(&quote.pcrs).map_err(|e| e.to_string())?;
    Ok(json!({
        "evidence_class": "certification",
        "evidence_type": "tpm_quote",
        "data": { "message": b64(&quote.attest), "signature": b64(&quote.signature), "subject_data": b64(&pcrs) },
    }))
}

/// The `uefi_log` evidence item: the raw TCG2 event log.
pub(crate) fn uefi_log_evidence(log: &[u8]) -> Value {
    json!({ "evidence_class": "log", "evidence_type": "uefi_log", "data": { "entries": b64(log) } })
}

/// `PATCH /v3.0/agents/{uuid}/attestations/latest`.
pub(crate) fn evidence(items: Vec<Value>) -> Value {
    json!({ "data": { "type": "attestation", "attributes": { "evidence_collected": items } } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        assert!(check_uuid("d432fbb3-d2f1-4a97-9ef7-75bd81c00000").is_ok());
        assert!(check_uuid("d432fbb3-d2f1-4a97-9ef7-75bd81c0000").is_err());
        assert!(check_uuid("../etc").is_err());
    }

    #[test]
    fn auth_tag_is_keylime_s_hmac() {
        // python3 -c 'import hmac,hashlib,base64; print(hmac.new(base64.b64encode(b"secret"),
        //   b"d432fbb3-d2f1-4a97-9ef7-75bd81c00000", hashlib.sha384).hexdigest())'
        let tag = auth_tag(b"secret", "d432fbb3-d2f1-4a97-9ef7-75bd81c00000");
        assert_eq!(tag.len(), 96);
        assert_eq!(tag, AUTH_TAG_SECRET);
    }

    const AUTH_TAG_SECRET: &str =
        "1e0a1d65ff767a4c2ca0365cd9eb1694cf3b506eca72bc8d6b12c3c47276e43d9ced330b989e4f30abd9a0cb298d82f4";

    #[test]
    fn evidence_request_from_keylime() {
        let body = json!({ "data": { "type": "attestation", "id": "3", "attributes": {
            "stage": "awaiting_evidence",
            "evidence_requested": [
                { "evidence_class": "certification", "evidence_type": "tpm_quote", "chosen_parameters": {
                    "challenge": "AAEC", "signature_scheme": "rsassa", "hash_algorithm": "sha256",
                    "selected_subjects": { "sha256": [0, 9] } } },
                { "evidence_class": "log", "evidence_type": "uefi_log",
                  "chosen_parameters": { "format": "application/octet-stream" } },
            ] } } });
        let r = EvidenceRequest::parse(&body).expect("parses");
        assert_eq!(r.index, "3");
        assert_eq!(r.quote, Some(QuoteRequest { challenge: vec![0, 1, 2], pcrs: vec![0, 9] }));
        assert!(r.uefi_log);
        let mut ecdsa = body.clone();
        ecdsa["data"]["attributes"]["evidence_requested"][0]["chosen_parameters"]["signature_scheme"] = json!("ecdsa");
        assert!(EvidenceRequest::parse(&ecdsa).is_err());
    }
}
