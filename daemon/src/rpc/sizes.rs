//! The one place that declares how large each method's request may be, and each service's
//! responses. Both bounds come from [`SERVICES`]: the per-method one the server checks on every
//! message's length prefix before anything is reserved for it ([`max_message`], through
//! `bounds::FrameLimit`), and the per-service one tonic enforces ([`service`], set in
//! `rpc::routes`). A method of the API missing here, or one listed that the API does not have,
//! fails the test below, which reads the API's own descriptors.
//!
//! It does not enforce anything itself.

use tpm_vault_proto::sealed_blob::MAX_BLOB;
use tpm_vault_proto::v1;

use super::seal::MAX_SECRET;
use super::MAX_MESSAGE_SIZE;

/// The largest message most methods take: their requests are names, digests, nonces, small
/// blobs (an ML-KEM-1024 ciphertext is 1,568 bytes; a signed approval a few hundred).
pub const DEFAULT_MAX_MESSAGE: usize = 64 * 1024;

/// A message to sign or verify, a stream chunk.
const MESSAGE: usize = MAX_MESSAGE_SIZE;
/// A certificate chain.
const CHAIN: usize = 1024 * 1024;
/// The secret to seal.
const SECRET: usize = MAX_SECRET + 4096;
/// A sealed blob: the secret's ciphertext and the import triple.
const SEALED_BLOB: usize = MAX_BLOB + 1024;
/// Anything else.
const SMALL: usize = DEFAULT_MAX_MESSAGE;

/// One gRPC service's size bounds.
#[derive(Debug)]
pub struct Service {
    /// The service's full name (`tpmvault.v1.KeyService`).
    pub name: &'static str,
    /// Its largest response message; `None` leaves tonic's default (no bound).
    pub max_response: Option<usize>,
    /// Each method's name and largest request message.
    pub methods: &'static [(&'static str, usize)],
}

impl Service {
    /// The largest request message any of its methods takes: tonic's per-service bound.
    pub const fn max_request(&self) -> usize {
        let mut max = 0;
        let mut i = 0;
        while i < self.methods.len() {
            if self.methods[i].1 > max {
                max = self.methods[i].1;
            }
            i += 1;
        }
        max
    }
}

/// Every service of the API with every method.
pub const SERVICES: &[Service] = &[
    Service {
        name: v1::key_service_server::SERVICE_NAME,
        max_response: Some(MAX_MESSAGE_SIZE),
        methods: &[
            ("CreateKey", SMALL),
            ("GetKey", SMALL),
            ("ListKeys", SMALL),
            ("DeleteKey", SMALL),
            ("GetPublicKey", SMALL),
            ("Sign", MESSAGE),
            ("Verify", MESSAGE),
            ("CreateCsr", SMALL),
            ("SetCertificate", CHAIN),
            ("GetCertificate", SMALL),
            ("CreateSelfSignedCertificate", SMALL),
            ("Decapsulate", SMALL),
            ("SetKeyUsage", SMALL),
        ],
    },
    Service {
        name: v1::status_service_server::SERVICE_NAME,
        max_response: None,
        methods: &[("GetStatus", SMALL), ("CheckAccess", SMALL)],
    },
    Service {
        name: v1::attestation_service_server::SERVICE_NAME,
        max_response: None,
        methods: &[
            ("GetAttestationKey", SMALL),
            ("Quote", SMALL),
            ("ReadPcrs", SMALL),
            ("ActivateCredential", SMALL),
            ("GetEventLog", SMALL),
            ("GetSrkPublic", SMALL),
            ("CertifySrk", SMALL),
            ("CertifyAttestationKey", SMALL),
        ],
    },
    Service {
        name: v1::crypto_service_server::SERVICE_NAME,
        max_response: Some(MAX_MESSAGE_SIZE),
        methods: &[
            ("CreateDataKey", SMALL),
            ("DeleteDataKey", SMALL),
            ("CreateStreamKey", SMALL),
            ("OpenStreamKey", SMALL),
            ("CommitStream", SMALL),
            ("VerifyStream", SMALL),
            ("Encrypt", MESSAGE),
            ("Decrypt", MESSAGE),
            ("GetRandom", SMALL),
        ],
    },
    Service {
        name: v1::seal_service_server::SERVICE_NAME,
        // An Unseal answer carries the secret.
        max_response: Some(SECRET),
        methods: &[
            ("Seal", SECRET),
            ("Unseal", SMALL),
            ("SignPolicy", SMALL),
            ("DeleteSealed", SMALL),
            ("ImportSealed", SEALED_BLOB),
        ],
    },
];

/// The bounds of the service named `name` (`tpmvault.v1.KeyService`), as `rpc::routes` sets
/// them.
///
/// # Panics
/// At compile time when used in a constant, for a name not in [`SERVICES`] (a bug).
pub const fn service(name: &str) -> &'static Service {
    let mut i = 0;
    while i < SERVICES.len() {
        if const_eq(SERVICES[i].name, name) {
            return &SERVICES[i];
        }
        i += 1;
    }
    panic!("service missing from rpc::sizes::SERVICES");
}

/// The largest gRPC message the method at `path` (`/tpmvault.v1.Service/Method`) may receive;
/// [`DEFAULT_MAX_MESSAGE`] for paths outside the API (health, reflection).
pub fn max_message(path: &str) -> usize {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return DEFAULT_MAX_MESSAGE;
    };
    SERVICES
        .iter()
        .filter(|s| s.name == service)
        .flat_map(|s| s.methods)
        .find(|(name, _)| *name == method)
        .map_or(DEFAULT_MAX_MESSAGE, |(_, max)| *max)
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost::Message as _;

    use super::*;

    #[test]
    fn every_method_of_the_api_is_listed_once() {
        let set = prost_types::FileDescriptorSet::decode(tpm_vault_proto::v1::FILE_DESCRIPTOR_SET).unwrap();
        let api: BTreeSet<String> = set
            .file
            .iter()
            .flat_map(|f| {
                let package = f.package().to_owned();
                f.service.iter().flat_map(move |s| {
                    let service = format!("{package}.{}", s.name());
                    s.method.iter().map(move |m| format!("{service}/{}", m.name()))
                })
            })
            .collect();
        let listed: Vec<String> =
            SERVICES.iter().flat_map(|s| s.methods.iter().map(move |(m, _)| format!("{}/{m}", s.name))).collect();
        let unique: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(unique.len(), listed.len(), "a method is listed twice");
        assert_eq!(unique, api, "rpc::sizes::SERVICES must list exactly the API's methods");
    }

    #[test]
    fn per_method_and_per_service_limits() {
        assert_eq!(max_message("/tpmvault.v1.SealService/Unseal"), DEFAULT_MAX_MESSAGE);
        assert_eq!(max_message("/tpmvault.v1.SealService/Seal"), MAX_SECRET + 4096);
        assert_eq!(max_message("/tpmvault.v1.KeyService/Sign"), MAX_MESSAGE_SIZE);
        assert_eq!(max_message("/tpmvault.v1.KeyService/SetCertificate"), 1024 * 1024);
        assert_eq!(max_message("/grpc.health.v1.Health/Check"), DEFAULT_MAX_MESSAGE);
        assert_eq!(max_message("garbage"), DEFAULT_MAX_MESSAGE);
        assert_eq!(service("tpmvault.v1.SealService").max_request(), MAX_SECRET + 4096);
        assert_eq!(service("tpmvault.v1.KeyService").max_request(), MAX_MESSAGE_SIZE);
        assert_eq!(service("tpmvault.v1.StatusService").max_request(), DEFAULT_MAX_MESSAGE);
    }
}
