//! Bulk cryptography end to end: the `tpm-vault` binary and the library's streaming helpers
//! against the real daemon over its own swtpm. Round trips at the 64 KiB chunk edges, wrong
//! context / key / tampering rejected with no plaintext, `decrypt NAME` checked against the
//! stream header, data key lifecycle, and random bytes.

mod support;

use std::io::Cursor;

use support::{data, fails, ok, Daemon, DaemonCli as _};
use tokio::io::AsyncReadExt;
use tpm_vault_client::{BlockingClient, Code, Error};

const CHUNK: usize = 64 * 1024;

/// Encrypted size of `len` plaintext bytes under a key named `name` (format v2): header with the
/// wrapped stream key (nonce 12, key 32, tag 16), then full chunks and one final (possibly
/// empty) chunk, each with a 16-byte tag.
fn sealed_len(name: &str, len: usize) -> usize {
    let header = 8 + 1 + 1 + name.len() + 16 + 4 + 12 + 32 + 16;
    // Format v3: header, chunks, then the 32-byte commitment.
    header + len + (len / CHUNK + 1) * 16 + 32
}

#[test]
fn cli_round_trips_at_the_chunk_edges() {
    let d = Daemon::start();
    let created = String::from_utf8(ok(d.cli(&["datakey", "create", "files"]))).unwrap();
    assert!(created.starts_with("name:") && created.contains("key id:"), "{created}");
    for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * 1024 * 1024 + 7] {
        let plain = data(len);
        let sealed = ok(d.cli_in(&["encrypt", "files", "--context", "tenant-1"], &plain));
        assert_eq!(sealed.len(), sealed_len("files", len), "len {len}");
        if len >= 64 {
            assert!(!sealed.windows(64).any(|w| w == &plain[..64]), "plaintext visible in the output");
        }
        let back = ok(d.cli_in(&["decrypt", "--context", "tenant-1"], &sealed));
        assert!(back == plain, "len {len}: round trip differs");
        // SPEC's form names the key; it must match the header.
        let back = ok(d.cli_in(&["decrypt", "files", "--context", "tenant-1"], &sealed));
        assert!(back == plain, "len {len}: round trip with NAME differs");
    }
}

#[test]
fn cli_rejects_wrong_context_key_and_tampering_without_plaintext() {
    let d = Daemon::start();
    ok(d.cli(&["datakey", "create", "dk-a"]));
    ok(d.cli(&["datakey", "create", "dk-b"]));
    let plain = data(3 * CHUNK + 100);
    let sealed = ok(d.cli_in(&["encrypt", "dk-a", "--context", "right"], &plain));

    // Wrong context: the stream key does not unwrap, nothing is written.
    let out = d.cli_in(&["decrypt", "--context", "wrong"], &sealed);
    let line = fails(&out, 2);
    assert!(line.starts_with("tpm-vault: the stream key does not open: wrong context"), "{line}");
    assert!(out.stdout.is_empty(), "{} bytes of plaintext written", out.stdout.len());
    // No context at all is a wrong context too.
    let out = d.cli_in(&["decrypt"], &sealed);
    fails(&out, 2);
    assert!(out.stdout.is_empty());

    // A flipped bit in chunk 2: chunks 0 and 1 are authentic and written, nothing of chunk 2.
    let header = sealed_len("dk-a", 0) - 16;
    let mut tampered = sealed.clone();
    tampered[header + 2 * (CHUNK + 16) + 10] ^= 1;
    let out = d.cli_in(&["decrypt", "--context", "right"], &tampered);
    let line = fails(&out, 2);
    assert!(line.contains("chunk 2 does not authenticate"), "{line}");
    assert!(out.stdout == plain[..2 * CHUNK], "only the chunks before the failing one");

    // Truncated: the final chunk is missing.
    let out = d.cli_in(&["decrypt", "--context", "right"], &sealed[..header + 3 * (CHUNK + 16)]);
    let line = fails(&out, 2);
    assert!(line.contains("truncated"), "{line}");

    // `decrypt NAME` with another key's name: refused before anything is sent.
    let out = d.cli_in(&["decrypt", "dk-b", "--context", "right"], &sealed);
    let line = fails(&out, 2);
    assert_eq!(line, "tpm-vault: the input was encrypted with data key \"dk-a\", not \"dk-b\"");
    assert!(out.stdout.is_empty());

    // Not an encrypted stream at all.
    let out = d.cli_in(&["decrypt"], b"just some text");
    assert_eq!(fails(&out, 2), "tpm-vault: not a tpm-vault encrypted stream: bad magic");
    let out = d.cli_in(&["decrypt", "dk-a"], b"just some text");
    assert_eq!(fails(&out, 2), "tpm-vault: not a tpm-vault encrypted stream: bad magic");
    let out = d.cli_in(&["decrypt"], b"");
    assert!(fails(&out, 2).contains("truncated"));

    // A deleted key: encryption and decryption are NOT_FOUND.
    assert_eq!(String::from_utf8(ok(d.cli(&["datakey", "delete", "dk-a"]))).unwrap(), "Deleted data key \"dk-a\"\n");
    let out = d.cli_in(&["decrypt", "--context", "right"], &sealed);
    assert_eq!(fails(&out, 3), "tpm-vault: key \"dk-a\" not found");
    assert!(out.stdout.is_empty());
    assert_eq!(fails(&d.cli_in(&["encrypt", "dk-a"], b"x"), 3), "tpm-vault: key \"dk-a\" not found");
    assert_eq!(fails(&d.cli(&["datakey", "delete", "dk-a"]), 3), "tpm-vault: key \"dk-a\" not found");
    // Re-created under the same name: a new generation, which the old stream does not match.
    ok(d.cli(&["datakey", "create", "dk-a"]));
    let out = d.cli_in(&["decrypt", "--context", "right"], &sealed);
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
}

#[test]
fn cli_datakey_errors_and_json() {
    let d = Daemon::start();
    let out = ok(d.cli(&["--output", "json", "datakey", "create", "k1"]));
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(json["name"], "k1");
    assert_eq!(json["key_id"].as_str().map(str::len), Some(32));
    assert_eq!(fails(&d.cli(&["datakey", "create", "k1"]), 4), "tpm-vault: key \"k1\" already exists");
    let line = fails(&d.cli(&["datakey", "create", "Bad!"]), 2);
    assert!(line.starts_with("tpm-vault: invalid key name \"Bad!\""), "{line}");
    // PCR-bound: usable while PCR 9 holds its value.
    ok(d.cli(&["datakey", "create", "bound", "--pcr", "sha256:9"]));
    let sealed = ok(d.cli_in(&["encrypt", "bound"], b"boot secret"));
    assert_eq!(ok(d.cli_in(&["decrypt", "bound"], &sealed)), b"boot secret");
    // Bound to a value PCR 9 does not hold: the key cannot be unsealed.
    let future = format!("sha256:9={}", "ab".repeat(32));
    ok(d.cli(&["datakey", "create", "future", "--pcr", &future]));
    let out = d.cli_in(&["encrypt", "future"], b"x");
    let line = fails(&out, 6);
    assert!(line.contains("sha256:9"), "{line}");
}

#[test]
fn cli_random_bytes() {
    let d = Daemon::start();
    let a = ok(d.cli(&["random", "1048576"]));
    let b = ok(d.cli(&["random", "1048576"]));
    assert_eq!(a.len(), 1 << 20);
    assert_ne!(a, b);
    assert!(a.iter().filter(|&&x| x == 0).count() < 8192, "looks random");
    // More than one request's worth (16 MiB).
    let big = ok(d.cli(&["random", "17825795"]));
    assert_eq!(big.len(), 17 * 1024 * 1024 + 3);
    assert!(ok(d.cli(&["random", "0"])).is_empty());
    assert_eq!(ok(d.cli(&["random", "1"])).len(), 1);
    let out = d.cli(&["random", "-5"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_readers_round_trip_and_fail_cleanly() {
    let d = Daemon::start();
    let client = d.client().await;
    let key = client.create_data_key("lib", None).await.unwrap();
    assert_eq!((key.name.as_str(), key.key_id.len()), ("lib", 32));
    let plain = data(5 * CHUNK + 17);

    // Reader adapters, chained: plaintext -> encrypt_reader -> decrypt_reader -> plaintext.
    let sealed = client.encrypt_reader("lib", b"ctx", Cursor::new(plain.clone())).unwrap();
    let mut back = Vec::new();
    client.decrypt_reader(b"ctx", sealed).unwrap().read_to_end(&mut back).await.unwrap();
    assert!(back == plain);

    // copy_* into memory, and the header names the key.
    let mut sealed = Vec::new();
    let n = client.copy_encrypt("lib", b"ctx", &mut &plain[..], &mut sealed).await.unwrap();
    assert_eq!(n as usize, sealed.len());
    assert_eq!(tpm_vault_client::stream_key_name(&sealed).unwrap().as_deref(), Some("lib"));

    // Wrong context: an InvalidData error carrying the daemon's status, and no bytes.
    let mut reader = client.decrypt_reader(b"other", Cursor::new(sealed.clone())).unwrap();
    let mut out = Vec::new();
    let err = reader.read_to_end(&mut out).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<Error>()).expect("client error inside");
    assert_eq!(inner.code(), Code::InvalidArgument);
    assert!(inner.to_string().contains("wrong context"), "{inner}");
    assert!(out.is_empty());
    // Reading again after the failure still fails.
    assert!(reader.read(&mut [0u8; 16]).await.is_err());

    // copy_decrypt with a wrong context: the daemon's error, nothing written.
    let mut out = Vec::new();
    let err = client.copy_decrypt(b"other", &mut &sealed[..], &mut out).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(out.is_empty());

    // Unknown key: NOT_FOUND, from the reader and from copy_encrypt.
    let mut reader = client.encrypt_reader("nope", b"", Cursor::new(b"x".to_vec())).unwrap();
    let err = reader.read_to_end(&mut Vec::new()).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    let err = client.copy_encrypt("nope", b"", &mut &b"x"[..], &mut Vec::new()).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Random bytes: one request, and more than one.
    assert_eq!(client.random(32).await.unwrap().len(), 32);
    let many = client.random(tpm_vault_client::MAX_RANDOM_REQUEST + 5).await.unwrap();
    assert_eq!(many.len(), tpm_vault_client::MAX_RANDOM_REQUEST + 5);
    assert!(client.random(0).await.unwrap().is_empty());

    client.delete_data_key("lib").await.unwrap();
    assert_eq!(client.delete_data_key("lib").await.unwrap_err().code(), Code::NotFound);
}

#[test]
fn blocking_client_encrypts_files() {
    let d = Daemon::start();
    let client = BlockingClient::connect(&d.socket).unwrap();
    client.create_data_key("blk", None).unwrap();
    let plain = data(2 * CHUNK + 3);
    let path = d.dir.path().join("plain");
    std::fs::write(&path, &plain).unwrap();
    let mut sealed = Vec::new();
    client.encrypt("blk", b"", &mut std::fs::File::open(&path).unwrap(), &mut sealed).unwrap();
    let mut back = Vec::new();
    assert_eq!(client.decrypt(b"", &mut &sealed[..], &mut back).unwrap(), plain.len() as u64);
    assert!(back == plain);
    assert_eq!(client.random(100).unwrap().len(), 100);
    let err = client.decrypt(b"x", &mut &sealed[..], &mut Vec::new()).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}
