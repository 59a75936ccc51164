//! What ACME enrollment remembers between runs, as one JSON document: the account URL of
//! each (directory, account key) pair, and each enrollment's settings, so that `cert renew`
//! repeats what `cert enroll` did. Reading and writing the file is the CLI's (atomically, with
//! its owner-only writer); this module owns the format.
//!
//! ```json
//! {"version": 1,
//!  "accounts": [{"directory": "https://ca/dir", "key": "acme-account", "url": "https://ca/acct/1"}],
//!  "enrollments": {"web": {"key": "web", "generation": 1, "directory": "https://ca/dir",
//!      "account_key": "acme-account", "domains": ["web.example"], "ips": [],
//!      "challenge": {"type": "http-01", "listen": "0.0.0.0:80"}, "ca_bundle": null, "contact": []}}}
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Method;

/// The format version written.
const VERSION: u32 = 1;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct State {
    /// Format version.
    pub(crate) version: u32,
    /// Registered accounts.
    #[serde(default)]
    pub(crate) accounts: Vec<AccountRecord>,
    /// Enrollments by name (the NAME given to `cert enroll`).
    #[serde(default)]
    pub(crate) enrollments: BTreeMap<String, Enrollment>,
}

/// An account at a CA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AccountRecord {
    /// The CA's directory URL.
    pub(crate) directory: String,
    /// The vault key of the account.
    pub(crate) key: String,
    /// The account URL (the JWS `kid`).
    pub(crate) url: String,
}

/// One enrolled certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Enrollment {
    /// The vault key that holds the certificate now (the enrollment's name, or
    /// `NAME.N` after `--new-key` rotations).
    pub(crate) key: String,
    /// 1 for the enrolled key, +1 per `--new-key`.
    pub(crate) generation: u32,
    /// The CA's directory URL.
    pub(crate) directory: String,
    /// The vault key of the account.
    pub(crate) account_key: String,
    /// DNS names.
    pub(crate) domains: Vec<String>,
    /// IP addresses.
    #[serde(default)]
    pub(crate) ips: Vec<IpAddr>,
    /// How challenges are answered.
    pub(crate) challenge: Method,
    /// PEM bundle trusted for the CA's HTTPS.
    #[serde(default)]
    pub(crate) ca_bundle: Option<PathBuf>,
    /// Account contacts.
    #[serde(default)]
    pub(crate) contact: Vec<String>,
}

impl State {
    /// Parses a state file's text; an empty text is an empty state.
    pub(crate) fn parse(text: &str) -> Result<State, String> {
        if text.trim().is_empty() {
            return Ok(State { version: VERSION, ..State::default() });
        }
        let state: State = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if state.version > VERSION {
            return Err(format!("written by a newer tpm-vault (format {}, this one reads {VERSION})", state.version));
        }
        Ok(state)
    }

    /// The file's text.
    pub(crate) fn to_json(&self) -> String {
        let mut state = self.clone();
        state.version = VERSION;
        // Serializing plain data cannot fail.
        serde_json::to_string_pretty(&state).unwrap_or_default() + "\n"
    }

    /// The account URL for `directory` and account key `key`.
    pub(crate) fn account(&self, directory: &str, key: &str) -> Option<&str> {
        self.accounts.iter().find(|a| a.directory == directory && a.key == key).map(|a| a.url.as_str())
    }

    /// Records (or updates) an account URL.
    pub(crate) fn set_account(&mut self, directory: &str, key: &str, url: &str) {
        self.accounts.retain(|a| !(a.directory == directory && a.key == key));
        self.accounts.push(AccountRecord { directory: directory.into(), key: key.into(), url: url.into() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_newer_versions_refused() {
        let mut state = State::parse("").unwrap();
        state.set_account("https://ca/dir", "acme-account", "https://ca/acct/1");
        state.set_account("https://ca/dir", "acme-account", "https://ca/acct/2");
        state.enrollments.insert(
            "web".into(),
            Enrollment {
                key: "web".into(),
                generation: 1,
                directory: "https://ca/dir".into(),
                account_key: "acme-account".into(),
                domains: vec!["web.example".into()],
                ips: vec!["127.0.0.1".parse().unwrap()],
                challenge: Method::Dns01 { hook: "/bin/true".into() },
                ca_bundle: None,
                contact: vec![],
            },
        );
        let text = state.to_json();
        let back = State::parse(&text).unwrap();
        assert_eq!(back.account("https://ca/dir", "acme-account"), Some("https://ca/acct/2"));
        assert_eq!(back.enrollments, state.enrollments);
        assert!(State::parse(r#"{"version": 9}"#).unwrap_err().contains("newer"));
        assert!(State::parse("{").is_err());
    }
}
