//! Stream format v2 (a key per stream, wrapped by the data key, AES-GCM in the caller's
//! process) end to end against the real daemon over its own swtpm: the in-process and daemon
//! paths interoperate both ways at the chunk edges and for 100 MiB; tampering, truncation,
//! reordering, splicing across streams, a header wrapped by another data key and a wrong
//! context each fail (exit 2) naming what and which chunk, writing only authenticated chunks;
//! a caller without `decrypt` gets no stream key; a deleted data key opens nothing; a
//! PCR-bound data key whose PCR changed refuses (exit 6).

mod support;

use support::{data, fails, ok, Daemon, DaemonCli as _};
use tpm_vault_client::BlockingClient;

const CHUNK: usize = 64 * 1024;
const TAG: usize = 16;

/// Header length of a v2 or v3 stream under a key named `name`.
fn header_len(name: &str) -> usize {
    8 + 1 + 1 + name.len() + 16 + 4 + 12 + 32 + TAG
}

#[test]
fn in_process_and_daemon_paths_interoperate() {
    let d = Daemon::start();
    ok(d.cli(&["datakey", "create", "dk"]));
    for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 3] {
        let plain = data(len);
        let local = ok(d.cli_in(&["encrypt", "dk", "--context", "c"], &plain));
        let daemon = ok(d.cli_in(&["encrypt", "dk", "--context", "c", "--in-daemon"], &plain));
        assert_eq!(local[8], 3, "format v3");
        assert_eq!(daemon[8], 3, "the daemon writes v3 too");
        assert_eq!(local.len(), daemon.len(), "len {len}");
        assert_ne!(local[..header_len("dk")], daemon[..header_len("dk")], "each stream has a key of its own");
        for sealed in [&local, &daemon] {
            for path in [&[][..], &["--in-daemon"][..]] {
                let args: Vec<&str> = ["decrypt", "--context", "c"].into_iter().chain(path.iter().copied()).collect();
                assert!(ok(d.cli_in(&args, sealed)) == plain, "len {len} {path:?}");
            }
        }
    }
    // 100 MiB through the library, both ways.
    let client = BlockingClient::connect(&d.socket).expect("connect");
    let plain = data(100 << 20);
    let (mut local, mut daemon) = (Vec::new(), Vec::new());
    client.encrypt("dk", b"big", &mut &plain[..], &mut local).expect("encrypt here");
    client.encrypt_in_daemon("dk", b"big", &mut &plain[..], &mut daemon).expect("encrypt in the daemon");
    let mut back = Vec::with_capacity(plain.len());
    client.decrypt_in_daemon(b"big", &mut &local[..], &mut back).expect("decrypt in the daemon");
    assert!(back == plain, "in-process stream, daemon decryption");
    back.clear();
    client.decrypt(b"big", &mut &daemon[..], &mut back).expect("decrypt here");
    assert!(back == plain, "daemon stream, in-process decryption");
}

#[test]
fn tampering_is_caught_before_any_unauthenticated_byte() {
    let d = Daemon::start();
    ok(d.cli(&["datakey", "create", "dk-a"]));
    ok(d.cli(&["datakey", "create", "dk-b"]));
    let plain = data(3 * CHUNK + 100);
    let a1 = ok(d.cli_in(&["encrypt", "dk-a", "--context", "right"], &plain));
    let a2 = ok(d.cli_in(&["encrypt", "dk-a", "--context", "right"], &plain));
    let b1 = ok(d.cli_in(&["encrypt", "dk-b", "--context", "right"], &plain));
    let (h, sealed) = (header_len("dk-a"), CHUNK + TAG);
    assert_eq!(header_len("dk-b"), h);
    for path in [&[][..], &["--in-daemon"][..]] {
        let decrypt = |stream: &[u8], context: &str| {
            let args: Vec<&str> = ["decrypt", "--context", context].into_iter().chain(path.iter().copied()).collect();
            d.cli_in(&args, stream)
        };
        // Wrong context: the stream key does not unwrap; nothing is written.
        let out = decrypt(&a1, "wrong");
        assert!(fails(&out, 2).contains("wrong context"), "{path:?}");
        assert!(out.stdout.is_empty());
        // A flipped bit in chunk 2: chunks 0 and 1 are written, nothing of chunk 2.
        let mut t = a1.clone();
        t[h + 2 * sealed + 10] ^= 1;
        let out = decrypt(&t, "right");
        assert!(fails(&out, 2).contains("chunk 2 does not authenticate"), "{path:?}");
        assert!(out.stdout == plain[..2 * CHUNK]);
        // Reordered chunks 0 and 1.
        let mut r = a1.clone();
        r[h..h + sealed].copy_from_slice(&a1[h + sealed..h + 2 * sealed]);
        r[h + sealed..h + 2 * sealed].copy_from_slice(&a1[h..h + sealed]);
        let out = decrypt(&r, "right");
        assert!(fails(&out, 2).contains("chunk 0 does not authenticate"), "{path:?}");
        assert!(out.stdout.is_empty());
        // Chunk 1 spliced in from another stream under the same data key.
        let mut s = a1.clone();
        s[h + sealed..h + 2 * sealed].copy_from_slice(&a2[h + sealed..h + 2 * sealed]);
        let out = decrypt(&s, "right");
        assert!(fails(&out, 2).contains("chunk 1 does not authenticate"), "{path:?}");
        assert!(out.stdout == plain[..CHUNK]);
        // The header of a stream under another data key on these chunks.
        let mut other = b1[..h].to_vec();
        other.extend_from_slice(&a1[h..]);
        let out = decrypt(&other, "right");
        assert!(fails(&out, 2).contains("chunk 0 does not authenticate"), "{path:?}");
        // This key's name with a stream key wrapped by the other data key.
        let mut rewrapped = a1.clone();
        rewrapped[h - 60..h].copy_from_slice(&b1[h - 60..h]);
        let out = decrypt(&rewrapped, "right");
        assert!(fails(&out, 2).contains("the stream key does not open"), "{path:?}");
        assert!(out.stdout.is_empty());
        // Truncated: the final chunk is gone, or the stream is cut inside it.
        let out = decrypt(&a1[..h + 3 * sealed], "right");
        assert!(fails(&out, 2).contains("truncated"), "{path:?}");
        let out = decrypt(&a1[..a1.len() - 1], "right");
        fails(&out, 2);
        // The untouched stream still decrypts.
        assert!(ok(decrypt(&a1, "right")) == plain);
    }
}

#[test]
fn no_stream_key_without_decrypt_or_after_delete() {
    let uid = nix::unistd::getuid().as_raw();
    let d = Daemon::start_with_policy(&format!(
        "[[rule]]\nname = \"enc\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\n\
         operations = [\"create\", \"encrypt\", \"delete\", \"public\"]\n"
    ));
    ok(d.cli(&["datakey", "create", "dk"]));
    let plain = data(CHUNK + 5);
    let sealed = ok(d.cli_in(&["encrypt", "dk"], &plain));
    for path in [&[][..], &["--in-daemon"][..]] {
        let args: Vec<&str> = ["decrypt"].into_iter().chain(path.iter().copied()).collect();
        let out = d.cli_in(&args, &sealed);
        let line = fails(&out, 5);
        assert!(line.contains("decrypt"), "{line}");
        assert!(out.stdout.is_empty(), "no plaintext without decrypt");
    }
    // The RPC itself: PERMISSION_DENIED, no key.
    let client = BlockingClient::connect(&d.socket).expect("connect");
    let err = client.decrypt(b"", &mut &sealed[..], &mut Vec::new()).expect_err("denied");
    assert_eq!(err.code(), tpm_vault_client::Code::PermissionDenied);

    let d = Daemon::start();
    ok(d.cli(&["datakey", "create", "dk"]));
    let sealed = ok(d.cli_in(&["encrypt", "dk"], &plain));
    ok(d.cli(&["datakey", "delete", "dk"]));
    for path in [&[][..], &["--in-daemon"][..]] {
        let args: Vec<&str> = ["decrypt"].into_iter().chain(path.iter().copied()).collect();
        let out = d.cli_in(&args, &sealed);
        fails(&out, 3);
        assert!(out.stdout.is_empty(), "a deleted data key opens nothing");
    }
}

#[test]
fn a_pcr_bound_data_key_refuses_once_pcr_9_changed() {
    let d = Daemon::start();
    ok(d.cli(&["datakey", "create", "bound", "--pcr", "sha256:9"]));
    let sealed = ok(d.cli_in(&["encrypt", "bound"], b"boot secret"));
    assert_eq!(ok(d.cli_in(&["decrypt", "bound"], &sealed)), b"boot secret");
    d.extend_pcr(9, b"another kernel");
    d.evict_data_keys();
    for args in [&["decrypt"][..], &["decrypt", "--in-daemon"][..]] {
        let out = d.cli_in(args, &sealed);
        let line = fails(&out, 6);
        assert!(line.contains("sha256:9"), "{line}");
        assert!(out.stdout.is_empty());
    }
    let line = fails(&d.cli_in(&["encrypt", "bound"], b"x"), 6);
    assert!(line.contains("sha256:9"), "{line}");
}
