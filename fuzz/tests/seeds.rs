//! Writes the seed corpora `corpus/<target>/` from the real code, so that every seed is an input
//! the daemon really produces or reads:
//! - `policy_file`, `config_file`: the shipped policy files and example config, plus a few
//!   rules that use every client kind and glob;
//! - `store_record`, `tpm_public`: key, sealed-secret and data-key records (and their TPM public
//!   areas) made by a vault over a private swtpm;
//! - `signed_policy`: approvals signed by the fuzz authority (`tpm_vault_fuzz::authority`) over
//!   real PCR policy digests, valid, revoked, expired and for other banks;
//! - `aead_stream`: streams made by `crypto::stream::Encryptor` under the fuzz data key;
//! - `certificate`: a self-signed certificate and a CSR of a vault key, and subjects;
//! - `quote`: a real quote of the vault's AK, a tpm2-tools `quote.pcrs` and a credential file;
//! - `hybrid_signature`, `tls_identity`, `metrics_request`, `credential_tpm2b`, `pcr_binding`,
//!   `pq_spki`, `ml_kem_key` (`parser_seeds`, no TPM): hybrid signatures by the fuzz key pair,
//!   client certificates (subjects with escapes, SPIFFE IDs), Prometheus scrapes, credential
//!   blobs, PCR bindings, and ML-DSA / ML-KEM public keys;
//! - `eventlog`: measured-boot logs as firmware writes them: crypto-agile with SHA-1, SHA-256,
//!   SHA-384 (and one with SHA-512 and SM3-256 too), StartupLocality, UEFI variable, image-load
//!   and text events; and a SHA-1-only log. Each parses and replays (checked here).
//!
//! - `ssh_userauth`, `ssh_sshsig` (`ssh_seeds`, no TPM): SSH user-authentication requests for
//!   the fuzz key (plain, host-bound, in a certificate), one for an RSA key, SSHSIG blobs, and
//!   a TLS 1.3 CertificateVerify content that neither may accept.
//!
//! Run with `./scripts/fuzz --seeds` (needs swtpm). The files are small: keep the corpora well
//! under 1 MiB in all.

use std::path::{Path, PathBuf};
use std::time::Duration;

use p256::ecdsa::signature::Signer;
use prost::Message;
use tpm_vault_client::attest::{encode_pcrs, CredentialFile};
use tpm_vault_client::PcrValues;
use tpm_vault_daemon::daemon::OwnerCheck;
use tpm_vault_daemon::formats::cert::CertSubject;
use tpm_vault_daemon::formats::store::{Record as _, Store};
use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_daemon::model::{KeyAlg, KeyName, PcrBank, PcrSelection, PcrTarget};
use tpm_vault_daemon::SealTarget;
use tpm_vault_daemon::{formats::pcr, QueueConfig};
use tpm_vault_daemon::{Vault, VaultConfig};
use tpm_vault_fuzz::{authority, authority_spki, RECORD_NAME, STREAM_CONTEXT, STREAM_KEY};
use tpm_vault_proto::signed_policy;
use tpm_vault_proto::stream::{wrap, DataKeyId, Encryptor, Header, Keying};
use tpm_vault_proto::v1::SignedPolicy;
use zeroize::Zeroizing;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_owned()
}

/// Empties `corpus/<target>` and returns it.
fn corpus(target: &str) -> PathBuf {
    let dir = root().join("corpus").join(target);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn name() -> KeyName {
    KeyName::try_from(RECORD_NAME).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn text_seeds() {
    let dir = corpus("policy_file");
    for sub in ["", "examples"] {
        let from = root().join("../policies").join(sub);
        for entry in std::fs::read_dir(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            if path.extension().is_some_and(|x| x == "toml") {
                let file = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
                write(&dir, &file, &std::fs::read(&path).unwrap_or_else(|e| panic!("{e}")));
            }
        }
    }
    write(
        &dir,
        "every-kind.toml",
        b"[[rule]]\nclients = [\"any\", \"uid:1000\", \"user:www-data\", \"gid:990\", \"group:tpm-vault\", \
          \"cert:CN=agent\"]\nkeys = [\"web-*\", \"db-?\", \"*.prod\"]\noperations = [\"sign\", \"public\"]\n\
          owner_only = true\n\n[[rule]]\nname = \"keyless\"\nclients = [\"uid:0\"]\noperations = [\"quote\", \
          \"random\", \"admin\"]\n",
    );

    let dir = corpus("config_file");
    write(
        &dir,
        "example.toml",
        &std::fs::read(root().join("../systemd/config.toml")).unwrap_or_else(|e| panic!("{e}")),
    );
    write(
        &dir,
        "every-field.toml",
        b"tcti = \"swtpm:host=127.0.0.1,port=2321\"\nsimulator = false\nstate_dir = \"/var/lib/tpm-vault\"\n\
          socket = \"/run/tpm-vault/vault.sock\"\npolicies = \"/etc/tpm-vault/policies\"\n\
          listen = \"127.0.0.1:8443\"\nmax_loaded_objects = 3\ntpm_timeout_ms = 10000\n\
          shutdown_grace_ms = 10000\nlog_format = \"json\"\nmetrics_listen = \"[::1]:9464\"\n\
          audit_log = \"/var/log/tpm-vault/audit.jsonl\"\ndatakey_idle_secs = 300\n",
    );
    write(&dir, "bad-value.toml", b"# comment\nmax_loaded_objects = 1\nmetrics_listen = \"0.0.0.0:9464\"\n");
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn signed_policy_seeds() {
    let dir = corpus("signed_policy");
    let key = authority();
    let sign = |msg: &[u8]| -> Vec<u8> {
        let sig: p256::ecdsa::Signature = key.sign(msg);
        sig.to_der().as_bytes().to_vec()
    };
    struct Case {
        file: &'static str,
        bank: PcrBank,
        pcrs: &'static [u32],
        version: u64,
        expires: i64,
        policy_ref: &'static [u8],
    }
    let case = |file, bank, pcrs, version, expires, policy_ref| Case { file, bank, pcrs, version, expires, policy_ref };
    let cases = [
        case("sha256-9-v2", PcrBank::Sha256, &[9], 2, 0, b""),
        case("sha256-multi-v7-expires-2100", PcrBank::Sha256, &[0, 7, 9, 23], 7, 4_102_444_800, b""),
        case("revoked-v1", PcrBank::Sha256, &[9], 1, 0, b""),
        case("expired", PcrBank::Sha256, &[9], 3, 1, b""),
        case("sha1-with-ref", PcrBank::Sha1, &[4, 9], 2, 0, b"ref"),
        case("sha384", PcrBank::Sha384, &[9, 10], 2, 0, b""),
    ];
    for Case { file, bank, pcrs, version, expires, policy_ref } in cases {
        let sel = PcrSelection::new(bank, pcrs).unwrap_or_else(|e| panic!("{e}"));
        let values: Vec<Vec<u8>> = sel.pcrs.iter().map(|&p| vec![p.wrapping_mul(17); bank.digest_len()]).collect();
        let approved = pcr::policy_pcr_digest(&sel, &values).unwrap_or_else(|e| panic!("{e}"));
        let approval = SignedPolicy {
            format_version: 1,
            pcr_bank: bank.as_str().into(),
            pcrs: sel.pcrs.iter().map(|&p| u32::from(p)).collect(),
            pcr_values: values,
            signature: sign(&signed_policy::approval_message(&approved, policy_ref)),
            envelope_signature: sign(&signed_policy::envelope_message(&approved, policy_ref, version, expires)),
            approved_policy: approved,
            policy_ref: policy_ref.to_vec(),
            policy_version: version,
            expires_unix: expires,
            authority_spki: authority_spki().to_vec(),
        };
        write(&dir, &format!("{file}.pb"), &approval.encode_to_vec());
    }
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn aead_stream_seeds() {
    let dir = corpus("aead_stream");
    // Small chunk sizes, so that a seed of a few hundred bytes has several chunks.
    for (chunk_size, len, seed) in [(16u32, 0usize, 1u64), (16, 40, 2), (64, 64, 3), (64, 200, 4), (65536, 100, 5)] {
        let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        // Format v1: the chunks under the data key, a random nonce prefix.
        let keying = Keying::DataKey { nonce_prefix: [7; 7] };
        let header = Header { key_name: RECORD_NAME.into(), key_id: [0x11; 16], chunk_size, keying };
        let mut out = seed.to_le_bytes().to_vec();
        encrypt_into(&STREAM_KEY, &header, &plain, &mut out);
        write(&dir, &format!("chunk{chunk_size}-len{len}.bin"), &out);
        // Format v2: a stream key wrapped by the data key.
        let stream_key = [seed as u8; 32];
        let id = DataKeyId { name: RECORD_NAME, id: [0x11; 16] };
        let header = wrap(&STREAM_KEY, id, chunk_size, STREAM_CONTEXT, [seed as u8; 12], &stream_key)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut out = seed.to_le_bytes().to_vec();
        encrypt_into(&stream_key, &header, &plain, &mut out);
        write(&dir, &format!("v2-chunk{chunk_size}-len{len}.bin"), &out);
    }
}

/// Appends the stream of `plain` under `key` with `header` to `out`.
fn encrypt_into(key: &[u8; 32], header: &Header, plain: &[u8], out: &mut Vec<u8>) {
    let mut e = Encryptor::new(key, header, STREAM_CONTEXT).unwrap_or_else(|e| panic!("{e}"));
    e.update(plain, out).unwrap_or_else(|e| panic!("{e}"));
    e.finish(out).unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "rewrites fuzz/corpus; needs swtpm; run by ./scripts/fuzz --seeds"]
async fn tpm_seeds() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let swtpm = Swtpm::start(&tmp.path().join("swtpm")).unwrap_or_else(|e| panic!("swtpm: {e}"));
    let state = tmp.path().join("state");
    let vault = Vault::open(VaultConfig {
        queue: QueueConfig { capacity: 64, timeout: Duration::from_secs(60) },
        simulator: true,
        ..VaultConfig::new(state.clone(), swtpm.tcti())
    })
    .await
    .unwrap_or_else(|e| panic!("open vault: {e}"));
    let store = Store::open(&state).unwrap_or_else(|e| panic!("{e}"));
    let records = corpus("store_record");
    let publics = corpus("tpm_public");
    let n = name();
    let sel = PcrSelection::new(PcrBank::Sha256, &[9, 16]).unwrap_or_else(|e| panic!("{e}"));

    for alg in KeyAlg::ALL {
        vault.create_key(n.clone(), alg, 1000, None, None).await.unwrap_or_else(|e| panic!("create {alg}: {e}"));
        let r = store.keys().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
        write(&records, &format!("key-{alg}.json"), &r.to_bytes());
        write(&publics, &format!("key-{alg}.bin"), &r.object.public);
        vault.delete(&n).await.unwrap_or_else(|e| panic!("{e}"));
    }
    // Certificates of a real key (self-signed, made by the vault through the TPM).
    let certs = corpus("certificate");
    vault.create_key(n.clone(), KeyAlg::EccP256, 0, None, None).await.unwrap_or_else(|e| panic!("{e}"));
    let subject = CertSubject::parse(
        "CN=fuzz,O=tpm-vault",
        &["fuzz.example".into()],
        &["127.0.0.1".into()],
        &["spiffe://example.org/fuzz".into()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let chain = vault.self_sign(&n, subject.clone(), 30, None).await.unwrap_or_else(|e| panic!("{e}")).chain_pem;
    write(&certs, "chain-self-signed.pem", &[b"\0", chain.as_bytes()].concat());
    write(&certs, "chain-twice.pem", &[b"\0", chain.as_bytes(), chain.as_bytes()].concat());
    let (csr, _) = vault.create_csr(&n, subject, None).await.unwrap_or_else(|e| panic!("{e}"));
    write(&certs, "csr.pem", &[b"\0", csr.as_bytes()].concat());
    write(
        &certs,
        "subject.txt",
        b"\x01CN=device-1,O=Example\\, Inc.,C=DE\ndns:a.example\ndns:*.example.org\nip:::1\nuri:spiffe://example.org/a",
    );
    write(&certs, "subject-bad.txt", b"\x01CN=x,CN=y,Q\ndns:-a..b\nip:1.2.3\nuri:nope");
    vault.delete(&n).await.unwrap_or_else(|e| panic!("{e}"));

    let bound = PcrTarget { selection: sel.clone(), values: None };
    vault.create_key(n.clone(), KeyAlg::EccP256, 0, None, Some(bound.clone())).await.unwrap_or_else(|e| panic!("{e}"));
    let r = store.keys().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
    write(&records, "key-pcr-bound.json", &r.to_bytes());
    vault.delete(&n).await.unwrap_or_else(|e| panic!("{e}"));

    let secret = || Zeroizing::new(b"seed secret".to_vec());
    vault
        .seal(n.clone(), secret(), SealTarget::Pcr { selection: sel.clone(), values: None }, 0, false)
        .await
        .unwrap_or_else(|e| panic!("seal: {e}"));
    let r = store.sealed().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
    write(&records, "sealed-pcr.json", &r.to_bytes());
    write(&publics, "sealed.bin", &r.object.public);
    let target = SealTarget::Authorized { selection: sel.clone(), authority_spki: authority_spki().to_vec() };
    vault.seal(n.clone(), secret(), target, 0, true).await.unwrap_or_else(|e| panic!("seal: {e}"));
    let r = store.sealed().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
    write(&records, "sealed-authorized.json", &r.to_bytes());

    vault.create_data_key(n.clone(), 0, None).await.unwrap_or_else(|e| panic!("data key: {e}"));
    let r = store.datakeys().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
    write(&records, "datakey.json", &r.to_bytes());
    write(&publics, "datakey.bin", &r.object.public);
    vault.delete_data_key(&n, OwnerCheck::any()).await.unwrap_or_else(|e| panic!("{e}"));
    vault.create_data_key(n.clone(), 0, Some(bound)).await.unwrap_or_else(|e| panic!("data key: {e}"));
    let r = store.datakeys().get(&n).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("no record"));
    write(&records, "datakey-pcr-bound.json", &r.to_bytes());

    // A real quote, as the verifier gets it (fields of the `quote` target, see its header),
    // with the TPM's signature (flags 0) and for the harness's own AK (flags 1), and tpm2-tools
    // files with its PCR values and a credential.
    let quotes = corpus("quote");
    let quoted = PcrSelection::new(PcrBank::Sha256, &[0, 7, 9]).unwrap_or_else(|e| panic!("{e}"));
    let nonce = b"fuzz nonce".to_vec();
    let q = vault.quote(quoted.clone(), nonce.clone()).await.unwrap_or_else(|e| panic!("quote: {e}"));
    let pcrs: Vec<u8> = quoted.pcrs.clone();
    let values: Vec<u8> = q.values.iter().flat_map(|v| [&[v.len() as u8][..], v].concat()).collect();
    let expected = format!("sha256:9={}", hex(&q.values[2]));
    let fields = [&q.attest[..], &q.signature, &q.ak.spki, &nonce, b"sha256", &pcrs, &values, expected.as_bytes()];
    let body: Vec<u8> = fields.iter().flat_map(|f| [&(f.len() as u16).to_be_bytes()[..], f].concat()).collect();
    write(&quotes, "quote-tpm.bin", &[&[0u8][..], &body].concat());
    write(&quotes, "quote-resigned.bin", &[&[1u8][..], &body].concat());
    let file = encode_pcrs(&PcrValues {
        bank: "sha256".into(),
        pcrs: quoted.pcrs.iter().map(|&p| u32::from(p)).collect(),
        values: q.values.clone(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    write(&quotes, "quote.pcrs", &file);
    let tpm2b = |n: usize| [&(n as u16).to_be_bytes()[..], &vec![0xa5; n]].concat();
    let cred = CredentialFile { credential_blob: tpm2b(68), encrypted_secret: tpm2b(256) };
    write(&quotes, "credential.bin", &cred.to_bytes());

    vault.shutdown(Duration::from_secs(5)).await;
}

/// An event log in the firmware's format: `banks` (TPM_ALG_ID, digest size) declared in a
/// Spec ID header, or the SHA-1-only format when `banks` is empty. Digests are the hash of the
/// data for the declared algorithms the parser knows (`HashAlg`).
fn event_log(banks: &[(u16, u16)], events: &[(u32, u32, &[u8])]) -> Vec<u8> {
    use tpm_vault_client::eventlog::HashAlg;
    let sha1_event = |out: &mut Vec<u8>, pcr: u32, kind: u32, digest: &[u8], data: &[u8]| {
        out.extend_from_slice(&pcr.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(digest);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    };
    let mut out = Vec::new();
    if banks.is_empty() {
        for (pcr, kind, data) in events {
            sha1_event(&mut out, *pcr, *kind, &HashAlg::Sha1.digest(data), data);
        }
        return out;
    }
    let mut spec = b"Spec ID Event03\0".to_vec();
    spec.extend_from_slice(&[0, 0, 0, 0, 0, 2, 2, 2]);
    spec.extend_from_slice(&(banks.len() as u32).to_le_bytes());
    for (id, size) in banks {
        spec.extend_from_slice(&id.to_le_bytes());
        spec.extend_from_slice(&size.to_le_bytes());
    }
    spec.push(0);
    sha1_event(&mut out, 0, 3, &[0; 20], &spec);
    for (pcr, kind, data) in events {
        out.extend_from_slice(&pcr.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&(banks.len() as u32).to_le_bytes());
        for (id, size) in banks {
            out.extend_from_slice(&id.to_le_bytes());
            let digest = HashAlg::from_id(*id).map(|alg| alg.digest(data)).unwrap_or_default();
            let digest = if *kind == 3 { vec![0; usize::from(*size)] } else { digest };
            out.extend_from_slice(&digest);
        }
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn eventlog_seeds() {
    let dir = corpus("eventlog");
    let utf16 = |text: &str| -> Vec<u8> { text.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    let guid = [0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c];
    let variable = [&guid[..], &10u64.to_le_bytes(), &1u64.to_le_bytes(), &utf16("SecureBoot"), &[1]].concat();
    let file = utf16("\\EFI\\BOOT\\BOOTX64.EFI\0");
    let mut path = vec![2, 1, 12, 0, 0xd0, 0x41, 0x03, 0x0a, 0, 0, 0, 0, 1, 1, 6, 0, 2, 0x1f, 4, 4];
    path.extend_from_slice(&((file.len() + 4) as u16).to_le_bytes());
    path.extend_from_slice(&file);
    path.extend_from_slice(&[0x7f, 0xff, 4, 0]);
    let image = [
        &0x7e00_0000u64.to_le_bytes()[..],
        &0x2_0000u64.to_le_bytes(),
        &0u64.to_le_bytes(),
        &(path.len() as u64).to_le_bytes(),
        &path,
    ]
    .concat();
    let blob = [0x80_0000u64.to_le_bytes(), 0x2_0000u64.to_le_bytes()].concat();
    let crtm = utf16("1.00\0");
    let events: Vec<(u32, u32, &[u8])> = vec![
        (0, 3, b"StartupLocality\0\x03"),
        (0, 8, &crtm),
        (0, 0x8000_0008, &blob),
        (7, 0x8000_0001, &variable),
        (0, 4, &[0; 4]),
        (7, 4, &[0; 4]),
        (4, 0x8000_0003, &image),
        (4, 0x8000_0007, b"Calling EFI Application from Boot Option"),
        (8, 0xd, b"grub_cmd: linux /vmlinuz root=/dev/vda1\0"),
        (9, 0xd, b"/boot/vmlinuz\0"),
    ];
    let logs = [
        ("agile-sha1-sha256-sha384.bin", event_log(&[(0x0004, 20), (0x000b, 32), (0x000c, 48)], &events)),
        (
            "agile-all-banks.bin",
            event_log(&[(0x0004, 20), (0x000b, 32), (0x000c, 48), (0x000d, 64), (0x0012, 32)], &events[..5]),
        ),
        ("sha1-only.bin", event_log(&[], &events[1..])),
    ];
    for (name, log) in logs {
        let parsed = tpm_vault_client::eventlog::EventLog::parse(&log).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            parsed.events.len(),
            if name.starts_with("sha1") {
                9
            } else if name.contains("all") {
                6
            } else {
                11
            }
        );
        assert!(!parsed.replay().pcrs.is_empty());
        write(&dir, name, &log);
    }
}

/// An ML-KEM encapsulation key that passes the FIPS 203 check, made without randomness:
/// `k` polynomials of fixed coefficients below q, then a fixed rho.
fn ml_kem_ek(k: usize) -> Vec<u8> {
    let coefficient = |i: usize| ((i * 1021 + 7) % 3329) as u32;
    let mut ek = Vec::with_capacity(384 * k + 32);
    for pair in 0..128 * k {
        let v = coefficient(2 * pair) | (coefficient(2 * pair + 1) << 12);
        ek.extend_from_slice(&v.to_le_bytes()[..3]);
    }
    ek.extend_from_slice(&[0x42; 32]);
    assert!(tpm_vault_fuzz::fips203_ok(k == 3, &ek));
    ek
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn parser_seeds() {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{KeyPair, PqdsaKeyPair};
    use tpm_vault_daemon::formats::pq::spki_der;
    use tpm_vault_proto::hybrid::{signed_message, HybridSignature};
    use tpm_vault_proto::v1::PcrBinding;

    // Hybrid signatures: 2-byte message length, message, signature.
    let dir = corpus("hybrid_signature");
    let sign = |message: &[u8]| -> Vec<u8> {
        let signed = signed_message(message);
        let ecdsa: p256::ecdsa::Signature = authority().sign(&signed);
        let mut ml_dsa = vec![0; tpm_vault_proto::hybrid::ML_DSA_65_LEN];
        tpm_vault_fuzz::ml_dsa_65().sign(&signed, &mut ml_dsa).unwrap_or_else(|e| panic!("{e}"));
        let sig = HybridSignature { ecdsa: ecdsa.to_der().as_bytes().to_vec(), ml_dsa };
        sig.encode().unwrap_or_else(|e| panic!("{e}"))
    };
    let framed = |message: &[u8], sig: &[u8]| [&(message.len() as u16).to_be_bytes()[..], message, sig].concat();
    let long: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    for (file, message) in [("empty", &b""[..]), ("firmware", b"firmware v1.2"), ("long", &long)] {
        write(&dir, &format!("{file}.bin"), &framed(message, &sign(message)));
    }
    write(&dir, "other-message.bin", &framed(b"firmware v1.3", &sign(b"firmware v1.2")));

    // Client certificates (DER), self-signed with the fuzz authority's key.
    let dir = corpus("tls_identity");
    let pkcs8 = p256::pkcs8::EncodePrivateKey::to_pkcs8_der(&authority()).unwrap_or_else(|e| panic!("{e}"));
    let key = rcgen::KeyPair::try_from(pkcs8.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let cert = |subject: &[(rcgen::DnType, &str)], uris: &[&str]| -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        params.self_signed(&key).unwrap_or_else(|e| panic!("{e}")).der().to_vec()
    };
    use rcgen::DnType::{CommonName, CountryName, OrganizationName, OrganizationalUnitName};
    write(&dir, "cn-o.der", &cert(&[(CommonName, "agent-1"), (OrganizationName, "Example")], &[]));
    write(
        &dir,
        "escapes.der",
        &cert(
            &[
                (CommonName, "#lead, \"quoted\"+plus;semi<less>\\back "),
                (OrganizationalUnitName, " ctl\x01\x7f ünï"),
                (CountryName, "DE"),
                (rcgen::DnType::CustomDnType(vec![1, 2, 3, 4]), "custom=oid"),
            ],
            &[],
        ),
    );
    write(&dir, "spiffe.der", &cert(&[(CommonName, "ignored")], &["spiffe://example.org/ns/prod/sa/agent"]));
    write(&dir, "spiffe-only.der", &cert(&[], &["https://example.org/", "spiffe://example.org/agent"]));
    write(&dir, "no-name.der", &cert(&[], &["https://example.org/"]));

    // HTTP request heads to the metrics endpoint: 8-byte read-split seed, then the bytes.
    let dir = corpus("metrics_request");
    let heads: [(&str, &[u8]); 6] = [
        (
            "prometheus",
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: Prometheus/2.45.0\r\n\
              Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3\r\n\
              Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n",
        ),
        ("curl-head", b"HEAD / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"),
        ("query-lf", b"GET /metrics?name[]=x HTTP/1.0\n\n"),
        ("post", b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"),
        ("absolute", b"GET http://127.0.0.1/metrics HTTP/1.1\r\n\r\n"),
        ("incomplete", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
    ];
    for (i, (file, head)) in heads.iter().enumerate() {
        write(&dir, &format!("{file}.txt"), &[&(i as u64 * 0x9e37_79b9).to_le_bytes()[..], *head].concat());
    }

    // ActivateCredential inputs: 2-byte blob length, TPM2B blob, TPM2B secret.
    let dir = corpus("credential_tpm2b");
    let tpm2b = |n: usize| [&(n as u16).to_be_bytes()[..], &vec![0xa5; n]].concat();
    for (file, blob, secret) in
        [("rsa-ek", 68, 256), ("largest", 132, 512), ("blob-too-large", 133, 256), ("secret-too-large", 68, 513)]
    {
        let (blob, secret) = (tpm2b(blob), tpm2b(secret));
        write(&dir, &format!("{file}.bin"), &[&(blob.len() as u16).to_be_bytes()[..], &blob, &secret].concat());
    }

    // PCR bindings.
    let dir = corpus("pcr_binding");
    let binding = |bank: &str, pcrs: &[u32], len: usize| PcrBinding {
        bank: bank.into(),
        pcrs: pcrs.to_vec(),
        values: if len == 0 { Vec::new() } else { pcrs.iter().map(|&p| vec![p as u8; len]).collect() },
    };
    let bindings = [
        ("default", PcrBinding::default()),
        ("sha256-9", binding("sha256", &[9], 0)),
        ("sha256-values", binding("sha256", &[9, 0, 7], 32)),
        ("sha1-values", binding("sha1", &[16, 4], 20)),
        ("sha384-23", binding("sha384", &[23, 1], 48)),
    ];
    for (file, b) in bindings {
        write(&dir, &format!("{file}.pb"), &b.encode_to_vec());
    }

    // Post-quantum public keys: SPKI for pq_spki, mode byte and raw key for ml_kem_key.
    let spkis = corpus("pq_spki");
    let raw_kem = corpus("ml_kem_key");
    for alg in [KeyAlg::MlDsa44, KeyAlg::MlDsa65, KeyAlg::MlDsa87] {
        let signing = tpm_vault_daemon::formats::pq::ml_dsa_signing(alg).unwrap_or_else(|| panic!("{alg}"));
        let kp = PqdsaKeyPair::from_seed(signing, &[0x44; 32]).unwrap_or_else(|e| panic!("{e}"));
        let der = kp.public_key().as_der().unwrap_or_else(|e| panic!("{e}"));
        write(&spkis, &format!("{alg}.der"), der.as_ref());
    }
    for (alg, k, mode) in [(KeyAlg::MlKem768, 3, 0u8), (KeyAlg::MlKem1024, 4, 1)] {
        let ek = ml_kem_ek(k);
        write(&spkis, &format!("{alg}.der"), &spki_der(alg, &ek).unwrap_or_else(|e| panic!("{e}")));
        write(&raw_kem, &format!("{alg}.bin"), &[&[mode][..], &ek].concat());
    }
    write(&spkis, "p256.der", authority_spki());
}

/// An SSH `string`.
fn ssh_string(bytes: &[u8]) -> Vec<u8> {
    [&(bytes.len() as u32).to_be_bytes()[..], bytes].concat()
}

/// What OpenSSH's client signs to log in (RFC 4252 section 7) with `key_blob`.
fn userauth(session: &[u8], method: &str, algorithm: &str, key_blob: &[u8], host_key: Option<&[u8]>) -> Vec<u8> {
    let mut d = ssh_string(session);
    d.push(50);
    d.extend(ssh_string(b"root"));
    d.extend(ssh_string(b"ssh-connection"));
    d.extend(ssh_string(method.as_bytes()));
    d.push(1);
    d.extend(ssh_string(algorithm.as_bytes()));
    d.extend(ssh_string(key_blob));
    if let Some(h) = host_key {
        d.extend(ssh_string(h));
    }
    d
}

/// An SSHSIG signed-data blob as `ssh-keygen -Y sign` makes it.
fn sshsig(namespace: &str, hash: &str, message_hash: &[u8]) -> Vec<u8> {
    let mut d = b"SSHSIG".to_vec();
    d.extend(ssh_string(namespace.as_bytes()));
    d.extend(ssh_string(b""));
    d.extend(ssh_string(hash.as_bytes()));
    d.extend(ssh_string(message_hash));
    d
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by ./scripts/fuzz --seeds"]
fn ssh_seeds() {
    use sha2::Digest as _;
    use tpm_vault_daemon::fuzzing::ssh::public_key_blob;
    // The content a TLS 1.3 server signs: what neither target may accept.
    let tls13 = [&[0x20; 64][..], b"TLS 1.3, server CertificateVerify\0", &[0xab; 32]].concat();

    let dir = corpus("ssh_userauth");
    let key = public_key_blob(KeyAlg::EccP256, authority_spki()).unwrap_or_else(|| panic!("fuzz key blob"));
    let host = [ssh_string(b"ssh-ed25519"), ssh_string(&[3; 32])].concat();
    let mut cert = ssh_string(b"ecdsa-sha2-nistp256-cert-v01@openssh.com");
    cert.extend(ssh_string(&[9; 32]));
    cert.extend(&key[23..]);
    cert.extend(ssh_string(b"serial, type, key id, principals, validity, options, signature key"));
    let rsa = [ssh_string(b"ssh-rsa"), ssh_string(&[1, 0, 1]), ssh_string(&[0xc5; 257])].concat();
    let hostbound = "publickey-hostbound-v00@openssh.com";
    write(&dir, "publickey.bin", &userauth(&[0x11; 32], "publickey", "ecdsa-sha2-nistp256", &key, None));
    write(&dir, "hostbound.bin", &userauth(&[0x22; 32], hostbound, "ecdsa-sha2-nistp256", &key, Some(&host)));
    let cert_alg = "ecdsa-sha2-nistp256-cert-v01@openssh.com";
    write(&dir, "certificate.bin", &userauth(&[0x33; 48], "publickey", cert_alg, &cert, None));
    write(&dir, "rsa-sha2-512.bin", &userauth(&[0x44; 64], hostbound, "rsa-sha2-512", &rsa, Some(&host)));
    write(&dir, "tls13-certificate-verify.bin", &tls13);

    let dir = corpus("ssh_sshsig");
    let message = b"a file signed with ssh-keygen -Y sign\n";
    write(&dir, "file-sha512.bin", &sshsig("file", "sha512", &sha2::Sha512::digest(message)));
    write(&dir, "git-sha256.bin", &sshsig("git", "sha256", &sha2::Sha256::digest(message)));
    write(&dir, "tls13-certificate-verify.bin", &tls13);
}
