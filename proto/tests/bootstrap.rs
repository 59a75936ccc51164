//! Regenerates `src/gen/` from the `.proto` files and fails if the committed code differs,
//! so the generated code never drifts from its source and builds need no protoc.

use std::path::{Path, PathBuf};

#[test]
fn generated_code_is_up_to_date() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile_dir();
    let protos: Vec<PathBuf> = std::fs::read_dir(root.join("tpmvault/v1"))
        .expect("proto dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    let mut protos = protos;
    protos.sort();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Bulk payloads decode as `Bytes` views of the received buffer instead of copies.
        .bytes(".tpmvault.v1.EncryptRequest.data")
        .bytes(".tpmvault.v1.EncryptResponse.data")
        .bytes(".tpmvault.v1.DecryptRequest.data")
        .bytes(".tpmvault.v1.DecryptResponse.data")
        .bytes(".tpmvault.v1.GetRandomResponse.data")
        // Responses that carry secrets are hand-written with zeroizing fields (src/secret.rs).
        .extern_path(".tpmvault.v1.UnsealResponse", "crate::secret::UnsealResponse")
        .extern_path(".tpmvault.v1.DecapsulateResponse", "crate::secret::DecapsulateResponse")
        .extern_path(".tpmvault.v1.ActivateCredentialResponse", "crate::secret::ActivateCredentialResponse")
        .out_dir(&out)
        .file_descriptor_set_path(out.join("tpmvault_descriptor.bin"))
        .compile_protos(&protos, std::slice::from_ref(&root))
        .expect("protoc");
    let gen = root.join("src/gen");
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(&out).expect("out dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        let fresh = std::fs::read(&path).expect("read fresh");
        let committed = std::fs::read(gen.join(&name)).unwrap_or_default();
        if fresh != committed {
            std::fs::write(gen.join(&name), &fresh).expect("write");
            stale.push(name);
        }
    }
    assert!(stale.is_empty(), "generated code was stale and has been rewritten: {stale:?}; commit proto/src/gen");
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tpm-vault-proto-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    assert!(Path::new(&dir).is_dir());
    dir
}
