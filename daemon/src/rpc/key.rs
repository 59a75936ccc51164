//! `tpmvault.v1.KeyService`: proto in, [`model`](crate::model) types at the edge, vault calls,
//! proto out.

use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_server::KeyService;
use zeroize::Zeroizing;

use super::{Call, Ctx};
use crate::auth::{identity, owner_of, Decision, Identity, Operation, Peer};
use crate::error::{Error, Invalid, SubjectArg};
use crate::model::{HashAlg, KeyAlg, KeyName, Scheme, SignInput, Usage, Usages};
use crate::vault::{CertSubject, Client, KeyInfo, Password, Resource, SignRequest, StoredChain, Visibility};

/// Largest page of ListKeys.
const MAX_PAGE: usize = 1000;

/// Most key records one ListKeys call reads, whatever the caller may see: a page may come back
/// short (even empty) with a next-page token when the records scanned were not the caller's.
pub const MAX_LIST_SCAN: usize = 1000;

/// The KeyService implementation.
#[derive(Debug, Clone)]
pub struct KeyRpc {
    ctx: Ctx,
}

impl KeyRpc {
    /// A service over `ctx`.
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx }
    }
}

fn name(s: &str) -> Result<KeyName, Error> {
    Ok(KeyName::try_from(s)?)
}

fn key_alg(v: i32) -> Result<KeyAlg, Error> {
    match pb::KeyAlgorithm::try_from(v) {
        Ok(pb::KeyAlgorithm::Unspecified) => Ok(KeyAlg::EccP256),
        Ok(alg) => KeyAlg::from_api(alg).ok_or_else(|| Invalid::Unknown { what: "key algorithm", value: v }.into()),
        Err(_) => Err(Invalid::Unknown { what: "key algorithm", value: v }.into()),
    }
}

fn alg_to_pb(a: KeyAlg) -> pb::KeyAlgorithm {
    a.api()
}

fn hash(v: i32) -> Result<Option<HashAlg>, Error> {
    match pb::HashAlgorithm::try_from(v) {
        Ok(h) => Ok(HashAlg::from_api(h)),
        Err(_) => Err(Invalid::Unknown { what: "hash algorithm", value: v }.into()),
    }
}

fn hash_to_pb(h: Option<HashAlg>) -> pb::HashAlgorithm {
    h.map_or(pb::HashAlgorithm::Unspecified, HashAlg::api)
}

fn scheme(v: i32) -> Result<Option<Scheme>, Error> {
    match pb::SignatureScheme::try_from(v) {
        Ok(s) => Ok(Scheme::from_api(s)),
        Err(_) => Err(Invalid::Unknown { what: "signature scheme", value: v }.into()),
    }
}

fn scheme_to_pb(s: Scheme) -> pb::SignatureScheme {
    s.api()
}

fn usage(v: i32) -> Result<Usage, Error> {
    match pb::KeyUsage::try_from(v) {
        Ok(pb::KeyUsage::Sign) => Ok(Usage::Sign),
        Ok(pb::KeyUsage::Ssh) => Ok(Usage::Ssh),
        Ok(pb::KeyUsage::Policy) => Ok(Usage::Policy),
        Ok(pb::KeyUsage::Unspecified) | Err(_) => Err(Invalid::Unknown { what: "key usage", value: v }.into()),
    }
}

/// The usages of a request; `default` when the list is empty.
fn usages(list: &[i32], default: Option<Usages>) -> Result<Usages, Error> {
    let parsed = list.iter().map(|&v| usage(v)).collect::<Result<Vec<_>, _>>()?;
    Usages::new(parsed).or(default).ok_or_else(|| Error::invalid("at least one usage is required (sign, ssh, policy)"))
}

fn usage_to_pb(u: Usage) -> pb::KeyUsage {
    match u {
        Usage::Sign => pb::KeyUsage::Sign,
        Usage::Ssh => pb::KeyUsage::Ssh,
        Usage::Policy => pb::KeyUsage::Policy,
    }
}

fn sign_input(message: Option<pb::sign_request::Input>) -> Result<SignInput, Error> {
    match message {
        Some(pb::sign_request::Input::Message(m)) => Ok(SignInput::Message(m)),
        Some(pb::sign_request::Input::Digest(d)) => Ok(SignInput::Digest(d)),
        None => Err(Error::invalid("either message or digest is required")),
    }
}

fn verify_input(message: Option<pb::verify_request::Input>) -> Result<SignInput, Error> {
    match message {
        Some(pb::verify_request::Input::Message(m)) => Ok(SignInput::Message(m)),
        Some(pb::verify_request::Input::Digest(d)) => Ok(SignInput::Digest(d)),
        None => Err(Error::invalid("either message or digest is required")),
    }
}

fn key_to_pb(k: KeyInfo) -> pb::Key {
    pb::Key {
        name: k.name.to_string(),
        algorithm: alg_to_pb(k.alg) as i32,
        tpm_name: hex::encode(&k.tpm_name),
        created_unix: k.created_unix,
        pcr_binding: k.pcr_policy.map(|p| pb::PcrBinding {
            bank: p.selection.bank.as_str().into(),
            pcrs: p.selection.pcrs.iter().map(|&i| u32::from(i)).collect(),
            values: p.values,
        }),
        owner_uid: k.owner_uid,
        has_auth: k.has_auth,
        usages: k.usages.iter().map(|u| usage_to_pb(u) as i32).collect(),
    }
}

fn subject(s: Option<pb::CertificateSubject>) -> Result<CertSubject, Error> {
    let s = s.ok_or_else(|| Error::from(Invalid::from(SubjectArg::Required)))?;
    CertSubject::parse(&s.subject, &s.dns_names, &s.ip_addresses, &s.uris)
}

fn chain_to_pb(c: StoredChain) -> pb::CertificateChain {
    pb::CertificateChain {
        name: c.name.to_string(),
        chain_pem: c.chain_pem,
        version: c.version,
        tpm_name: hex::encode(&c.tpm_name),
    }
}

fn auth(bytes: Vec<u8>) -> Option<Zeroizing<Vec<u8>>> {
    (!bytes.is_empty()).then(|| Zeroizing::new(bytes))
}

/// Who presents a request's key password, for the dictionary-attack guard: the certificate
/// identity the TLS listener attached, else the Unix peer's uid. Cheap (no name lookups), as it
/// runs on every Sign.
fn client_of<T>(req: &Request<T>) -> Client {
    match req.extensions().get::<Identity>() {
        Some(id) => Client::from(id),
        None => Peer::of(req).map_or_else(|| Client::from(&Identity::Unknown), |p| Client::uid(p.uid)),
    }
}

/// The key password of a request (none when empty), presented by `client`.
fn password(client: Client, bytes: Vec<u8>) -> Option<Password> {
    auth(bytes).map(|secret| Password::new(client, secret))
}

#[tonic::async_trait]
impl KeyService for KeyRpc {
    async fn create_key(&self, req: Request<pb::CreateKeyRequest>) -> Result<Response<pb::Key>, Status> {
        let owner = owner_of(&req);
        let who = identity(&req).unwrap_or(Identity::Unknown);
        self.ctx
            .on_key(
                "CreateKey",
                req,
                Operation::Create,
                |r| &r.name,
                |r, n, vault| async move {
                    let alg = key_alg(r.algorithm)?;
                    let pcr = r.pcr_binding.map(super::pcr_binding).transpose()?;
                    let usages = usages(&r.usages, Some(Usages::DEFAULT))?;
                    // Once the request is allowed and well-formed, an RSA key generation (seconds
                    // of TPM time on a real TPM): one in flight per client, within its quota
                    // (issue #31, item 7).
                    let _keygen = if alg.is_rsa() { Some(self.ctx.access.take_keygen_slot(&who).await?) } else { None };
                    vault.create_key_with_usages(n, alg, owner?, auth(r.auth), pcr, usages).await.map(key_to_pb)
                },
            )
            .await
    }

    async fn get_key(&self, req: Request<pb::GetKeyRequest>) -> Result<Response<pb::Key>, Status> {
        self.ctx
            .on_key(
                "GetKey",
                req,
                Operation::Public,
                |r| &r.name,
                |_, n, vault| async move { vault.key(&n).await.map(key_to_pb) },
            )
            .await
    }

    async fn list_keys(&self, req: Request<pb::ListKeysRequest>) -> Result<Response<pb::ListKeysResponse>, Status> {
        let who = identity(&req);
        let call = Call::start(&self.ctx, "ListKeys", Operation::Public, &req);
        let r = req.into_inner();
        // No policy decision for the call itself (every client may list; the answer shows only
        // the keys the caller may see): its record has the decision `none`.
        let result = match who {
            Some(who) => self.list_visible(&who, r).await,
            None => Ok(pb::ListKeysResponse::default()),
        };
        call.end(result)
    }

    async fn delete_key(&self, req: Request<pb::DeleteKeyRequest>) -> Result<Response<pb::DeleteKeyResponse>, Status> {
        self.ctx
            .on_named_write(
                "DeleteKey",
                req,
                (Operation::Delete, Resource::Key),
                |r| &r.name,
                |_, n, check, vault| async move {
                    vault.delete_checked(&n, check).await.map(|()| pb::DeleteKeyResponse {})
                },
            )
            .await
    }

    async fn get_public_key(&self, req: Request<pb::GetPublicKeyRequest>) -> Result<Response<pb::PublicKey>, Status> {
        self.ctx
            .on_key(
                "GetPublicKey",
                req,
                Operation::Public,
                |r| &r.name,
                |_, n, vault| async move {
                    let (alg, der) = vault.public_key(&n).await?;
                    let ml_dsa_der = vault.hybrid_ml_dsa_public_key(&n).await?.unwrap_or_default();
                    Ok(pb::PublicKey {
                        pem: pem_public_key(&der),
                        der,
                        algorithm: alg_to_pb(alg) as i32,
                        ml_dsa_pem: if ml_dsa_der.is_empty() { String::new() } else { pem_public_key(&ml_dsa_der) },
                        ml_dsa_der,
                    })
                },
            )
            .await
    }

    async fn sign(&self, req: Request<pb::SignRequest>) -> Result<Response<pb::SignResponse>, Status> {
        let client = client_of(&req);
        self.ctx
            .on_key(
                "Sign",
                req,
                Operation::Sign,
                |r| &r.name,
                |r, n, vault| async move {
                    let request =
                        SignRequest { input: sign_input(r.input)?, hash: hash(r.hash)?, scheme: scheme(r.scheme)? };
                    let auth = password(client, r.auth);
                    let out = match pb::SignPurpose::try_from(r.purpose) {
                        Ok(pb::SignPurpose::Unspecified) => vault.sign(&n, request, auth).await?,
                        Ok(pb::SignPurpose::Ssh) => vault.sign_ssh(&n, request, auth).await?,
                        Err(_) => return Err(Invalid::Unknown { what: "sign purpose", value: r.purpose }.into()),
                    };
                    Ok(pb::SignResponse {
                        signature: out.signature,
                        scheme: scheme_to_pb(out.scheme) as i32,
                        hash: hash_to_pb(out.hash) as i32,
                    })
                },
            )
            .await
    }

    async fn verify(&self, req: Request<pb::VerifyRequest>) -> Result<Response<pb::VerifyResponse>, Status> {
        self.ctx
            .on_key(
                "Verify",
                req,
                Operation::Public,
                |r| &r.name,
                |r, n, vault| async move {
                    let input = verify_input(r.input)?;
                    let valid = vault.verify(&n, input, &r.signature, hash(r.hash)?, scheme(r.scheme)?).await?;
                    Ok(pb::VerifyResponse { valid })
                },
            )
            .await
    }

    async fn create_csr(&self, req: Request<pb::CreateCsrRequest>) -> Result<Response<pb::CreateCsrResponse>, Status> {
        let client = client_of(&req);
        self.ctx
            .on_key(
                "CreateCsr",
                req,
                Operation::Sign,
                |r| &r.name,
                |r, n, vault| async move {
                    let subject = subject(r.subject)?;
                    let (pem, der) = vault.create_csr(&n, subject, password(client, r.auth)).await?;
                    Ok(pb::CreateCsrResponse { pem, der })
                },
            )
            .await
    }

    async fn set_certificate(
        &self,
        req: Request<pb::SetCertificateRequest>,
    ) -> Result<Response<pb::CertificateChain>, Status> {
        self.ctx
            .on_key(
                "SetCertificate",
                req,
                Operation::Create,
                |r| &r.name,
                |r, n, vault| async move { vault.set_certificate(&n, &r.chain_pem).await.map(chain_to_pb) },
            )
            .await
    }

    async fn get_certificate(
        &self,
        req: Request<pb::GetCertificateRequest>,
    ) -> Result<Response<pb::CertificateChain>, Status> {
        self.ctx
            .on_key(
                "GetCertificate",
                req,
                Operation::Public,
                |r| &r.name,
                |_, n, vault| async move { vault.certificate(&n).await.map(chain_to_pb) },
            )
            .await
    }

    async fn create_self_signed_certificate(
        &self,
        req: Request<pb::CreateSelfSignedCertificateRequest>,
    ) -> Result<Response<pb::CertificateChain>, Status> {
        let mut call = Call::start(&self.ctx, "CreateSelfSignedCertificate", Operation::Create, &req);
        let client = client_of(&req);
        let r = req.into_inner();
        let result = async {
            let n = name(&r.name)?;
            // The TPM signs (sign) and the result replaces the stored chain (create): two
            // decisions, each audited.
            call.authorize_as(Operation::Sign, Some((&n, Resource::Key))).await?;
            let vault = call.authorize(Some((&n, Resource::Key))).await?;
            let subject = subject(r.subject)?;
            vault.self_sign(&n, subject, r.days, password(client, r.auth)).await
        }
        .await;
        call.end(result.map(chain_to_pb))
    }

    async fn set_key_usage(&self, req: Request<pb::SetKeyUsageRequest>) -> Result<Response<pb::Key>, Status> {
        self.ctx
            .on_key(
                "SetKeyUsage",
                req,
                Operation::Create,
                |r| &r.name,
                |r, n, vault| async move {
                    let usages = usages(&r.usages, None)?;
                    vault.set_usages(&n, usages).await.map(key_to_pb)
                },
            )
            .await
    }

    async fn decapsulate(
        &self,
        req: Request<pb::DecapsulateRequest>,
    ) -> Result<Response<pb::DecapsulateResponse>, Status> {
        self.ctx
            .on_key(
                "Decapsulate",
                req,
                Operation::Decrypt,
                |r| &r.name,
                |r, n, vault| async move {
                    // The zeroizing buffer moves into the response (`tpm_vault_proto::secret`).
                    let shared_secret = vault.decapsulate(&n, &r.ciphertext).await?;
                    Ok(pb::DecapsulateResponse { shared_secret })
                },
            )
            .await
    }
}

impl KeyRpc {
    /// ListKeys for `who`: pages over the keys the policy lets it see (`public`), filtered
    /// before paging, reading at most [`MAX_LIST_SCAN`] records; the page token is opaque
    /// ([`crate::vault::Vault::page_token`]), so a caller can neither choose where a page starts
    /// nor learn where a hidden key sits.
    async fn list_visible(&self, who: &Identity, r: pb::ListKeysRequest) -> Result<pb::ListKeysResponse, Error> {
        let limit = match r.page_size as usize {
            0 => MAX_PAGE,
            n => n.min(MAX_PAGE),
        };
        let caller = who.to_string();
        let vault = &self.ctx.vault;
        let after = if r.page_token.is_empty() { None } else { Some(vault.page_position(&caller, &r.page_token)?) };
        let policy = self.ctx.access.current();
        let by_owner = policy.has_owner_rules();
        let visible = |v: Visibility<'_>| match v.owner {
            // Without owner-only rules the name decides; with them, read the owner first.
            None if by_owner => true,
            owner => matches!(policy.decide(who, Operation::Public, Some(v.name), owner), Decision::Allow(_)),
        };
        let page = vault.list_visible(after, limit, MAX_LIST_SCAN, visible).await?;
        let next_page_token = match &page.next {
            Some(position) => vault.page_token(&caller, position)?,
            None => String::new(),
        };
        Ok(pb::ListKeysResponse { keys: page.keys.into_iter().map(key_to_pb).collect(), next_page_token })
    }
}

/// PEM "PUBLIC KEY" armour for DER SubjectPublicKeyInfo.
pub fn pem_public_key(der: &[u8]) -> String {
    use p256::pkcs8::der::pem::{encode_string, LineEnding};
    encode_string("PUBLIC KEY", LineEnding::LF, der).unwrap_or_default()
}
