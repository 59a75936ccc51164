//! The Prometheus endpoint's HTTP request head (`metrics_listen`; plain HTTP, no
//! authentication, any local process can connect): `telemetry::Request::parse`, through
//! `tpm_vault_daemon::fuzzing::metrics_request`, fed as the endpoint reads a connection (the
//! bytes so far after each read) and whole.
//!
//! Input: an 8-byte seed that picks where the reads end (`tpm_vault_fuzz::pieces`), then the
//! bytes the client sends.
//!
//! Properties: no panic; the answer does not depend on how the bytes arrive; a head counts as
//! complete once, and only once, its blank line is there; a `GET`/`HEAD` path starts with `/` and
//! holds no whitespace or query string; the answer comes from the first line only.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::fuzzing::metrics_request;

/// The endpoint's head limit (`telemetry::MAX_HEAD`).
const MAX_HEAD: usize = 8 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((seed, bytes)) = data.split_first_chunk::<8>() else { return };
    let whole = metrics_request(bytes);
    let complete = find(bytes, b"\r\n\r\n").or_else(|| find(bytes, b"\n\n"));
    assert_eq!(whole.is_some(), complete.is_some(), "complete iff the blank line is there");

    // As `telemetry::handle` reads: parse what has arrived after each read, until a head is
    // complete or the limit is passed.
    let mut received = Vec::new();
    let mut incremental = None;
    for n in tpm_vault_fuzz::pieces(u64::from_le_bytes(*seed), bytes.len()) {
        received.extend_from_slice(&bytes[received.len()..received.len() + n]);
        if let Some(r) = metrics_request(&received) {
            incremental = Some(r);
            break;
        }
        if received.len() > MAX_HEAD {
            break;
        }
    }
    if let Some(r) = &incremental {
        assert_eq!(Some(r), whole.as_ref(), "the answer depends on how the bytes arrived");
    }

    if let Some(Ok((path, _))) = &whole {
        assert!(path.starts_with('/'), "path {path:?}");
        assert!(!path.contains('?'), "query string kept: {path:?}");
        assert!(!path.chars().any(|c| c.is_ascii_whitespace()), "whitespace in {path:?}");
    }
    // Only the request line matters: headers after it never change the answer.
    if let (Some(answer), Some(line_end)) = (&whole, find(bytes, b"\n")) {
        let mut other = bytes[..=line_end].to_vec();
        other.extend_from_slice(b"X-Other: 1\r\n\r\n");
        assert_eq!(metrics_request(&other).as_ref(), Some(answer), "headers changed the answer");
    }
});

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
