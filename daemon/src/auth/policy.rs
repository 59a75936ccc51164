//! Access policies: who may do what to which key. Deny by default.
//!
//! A policy directory holds TOML files; each has `[[rule]]` tables:
//! ```toml
//! [[rule]]
//! name = "tls-server"            # shown in audit events and `tpm-vault access check`
//! clients = ["user:www-data"]    # any | uid:N | user:NAME | gid:N | group:NAME | cert:SUBJECT
//! keys = ["web-*"]               # globs over key names (* and ?); "*" = every key
//! operations = ["sign", "public"]
//! owner_only = false             # true: only keys this client created
//! ```
//! A request is allowed when at least one rule matches its client, key and operation; the
//! first matching rule (files in name order, rules in file order) is reported. Files that do
//! not parse, or name an unknown operation or client kind, a bad glob or an empty list, are
//! rejected with file, line and reason: at start the daemon refuses to run, on reload the old
//! policy stays in force. A `user:` or `group:` that the system does not know is loaded (it may
//! be created later) but warned about, at load and by `--check-config`: it is usually a typo.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use toml::Spanned;

use super::peer::Identity;
use crate::model::{KeyName, Owner};

pub use tpm_vault_proto::operation::Operation;

/// Which clients a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMatch {
    /// Every authenticated client.
    Any,
    /// A Unix user id.
    Uid(u32),
    /// A Unix user name.
    User(String),
    /// A Unix group id (primary or supplementary).
    Gid(u32),
    /// A Unix group name (primary or supplementary).
    Group(String),
    /// A TLS client certificate subject (or SPIFFE ID) on the TCP listener.
    Cert(String),
}

impl FromStr for ClientMatch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parse_id = |v: &str| v.parse::<u32>().map_err(|_| format!("{s:?}: not a number"));
        match s.split_once(':') {
            None if s == "any" => Ok(Self::Any),
            Some(("uid", v)) => parse_id(v).map(Self::Uid),
            Some(("gid", v)) => parse_id(v).map(Self::Gid),
            Some(("user", v)) if !v.is_empty() => Ok(Self::User(v.into())),
            Some(("group", v)) if !v.is_empty() => Ok(Self::Group(v.into())),
            Some(("cert", v)) if !v.is_empty() => Ok(Self::Cert(v.into())),
            _ => {
                Err(format!("unknown client {s:?} (expected any, uid:N, user:NAME, gid:N, group:NAME or cert:SUBJECT)"))
            }
        }
    }
}

impl ClientMatch {
    /// For `user:NAME` and `group:NAME` that the system's user and group databases do not
    /// know, what is missing; `None` otherwise (and when the lookup itself fails).
    fn unknown_to_the_system(&self) -> Option<String> {
        match self {
            Self::User(n) => {
                matches!(nix::unistd::User::from_name(n), Ok(None)).then(|| format!("no user {n:?} on this system"))
            }
            Self::Group(n) => {
                matches!(nix::unistd::Group::from_name(n), Ok(None)).then(|| format!("no group {n:?} on this system"))
            }
            _ => None,
        }
    }

    fn matches(&self, who: &Identity) -> bool {
        match (self, who) {
            (Self::Any, _) => true,
            (Self::Uid(u), Identity::Unix(p)) => p.uid == *u,
            (Self::User(n), Identity::Unix(p)) => p.user.as_deref() == Some(n.as_str()),
            (Self::Gid(g), Identity::Unix(p)) => p.gid == *g || p.groups.iter().any(|(id, _)| id == g),
            (Self::Group(n), Identity::Unix(p)) => p.groups.iter().any(|(_, name)| name == n),
            (Self::Cert(subject), Identity::Cert { subject: s }) => s == subject,
            _ => false,
        }
    }
}

/// A key-name glob (`*` any run, `?` one character).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    /// The glob `pattern` (`*` any run, `?` one character).
    pub fn new(pattern: &str) -> Self {
        Self(pattern.to_owned())
    }

    /// True if `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }
}

fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    // Iterative wildcard matching with single backtrack point: O(len(p) * len(t)) worst case.
    let (mut p, mut t) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = t;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            t = mark;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// One rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Name for audit and explanations: the file's `name`, or `FILE#N`.
    pub name: String,
    pub clients: Vec<ClientMatch>,
    /// Key globs; empty = operations without a key only.
    pub keys: Vec<Glob>,
    /// Operations granted.
    pub operations: Vec<Operation>,
    /// Only keys the client created.
    pub owner_only: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRules {
    #[serde(default)]
    rule: Vec<RawRule>,
}

/// A rule as written, each value with its place in the file (for the line in errors).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    clients: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    keys: Vec<Spanned<String>>,
    operations: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    owner_only: bool,
}

/// A policy-file error, naming the file, line and reason.
#[derive(Debug, thiserror::Error)]
#[error("policy {path}: {reason}")]
pub struct PolicyError {
    /// File (or directory).
    pub path: PathBuf,
    /// What is wrong, with line and column where the parser knows them.
    pub reason: String,
}

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by the named rule.
    Allow(String),
    /// No rule allows it.
    Deny,
}

/// The shipped `policies/default.toml`: in force when the default policy directory does not
/// exist (a machine where only the binary was installed), so the daemon still starts.
pub const BUILTIN_DEFAULT: &str = include_str!("../../../policies/default.toml");

/// Where the built-in default policy says its rules came from.
pub const BUILTIN_NAME: &str = "built-in default policy";

/// A loaded set of rules.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Vec<Rule>,
    files: Vec<PathBuf>,
    warnings: Vec<String>,
    builtin: bool,
}

impl Policy {
    /// Loads the policy directory `dir`; when it is the default one (`configured` false) and
    /// does not exist, the built-in default policy ([`BUILTIN_DEFAULT`]). A directory that was
    /// configured must exist.
    ///
    /// # Errors
    /// [`PolicyError`] as [`Policy::load_dir`].
    pub fn load(dir: &Path, configured: bool) -> Result<Self, PolicyError> {
        if !configured && matches!(std::fs::metadata(dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            let mut policy = Policy::default();
            policy.add_file(Path::new(BUILTIN_NAME), BUILTIN_DEFAULT)?;
            policy.builtin = true;
            return Ok(policy);
        }
        Self::load_dir(dir)
    }

    /// True when this is the built-in default policy (no policy directory).
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// Loads every `*.toml` file in `dir` (name order).
    ///
    /// # Errors
    /// [`PolicyError`] for an unreadable directory or file, or a file that does not parse.
    pub fn load_dir(dir: &Path) -> Result<Self, PolicyError> {
        let err = |reason: String| PolicyError { path: dir.to_owned(), reason };
        let entries = std::fs::read_dir(dir).map_err(|e| err(format!("cannot read policy directory: {e}")))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let mut policy = Policy::default();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| PolicyError { path: file.clone(), reason: e.to_string() })?;
            policy.add_file(&file, &text)?;
        }
        for warning in policy.warnings() {
            tracing::warn!("policy {warning} (a typo? the rule cannot match it)");
        }
        Ok(policy)
    }

    /// Parses one file's text and appends its rules.
    ///
    /// # Errors
    /// [`PolicyError`] naming line and reason.
    pub fn add_file(&mut self, path: &Path, text: &str) -> Result<(), PolicyError> {
        let err = |reason: String| PolicyError { path: path.to_owned(), reason };
        let raw: FileRules = toml::from_str(text).map_err(|e| err(one_line(&e.to_string())))?;
        let stem = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
        let line = |span: std::ops::Range<usize>| text.get(..span.start).map_or(0, |t| t.matches('\n').count()) + 1;
        let mut rules = Vec::with_capacity(raw.rule.len());
        let mut warnings = Vec::new();
        for (i, r) in raw.rule.into_iter().enumerate() {
            let name = r.name.unwrap_or_else(|| format!("{stem}#{}", i + 1));
            let at =
                |span: std::ops::Range<usize>, what: String| err(format!("line {}: rule {name:?}: {what}", line(span)));
            let mut clients = Vec::with_capacity(r.clients.get_ref().len());
            for c in r.clients.get_ref() {
                let client: ClientMatch = c.get_ref().parse().map_err(|e| at(c.span(), e))?;
                if let Some(missing) = client.unknown_to_the_system() {
                    warnings.push(format!("{}: line {}: rule {name:?}: {missing}", path.display(), line(c.span())));
                }
                clients.push(client);
            }
            let mut operations = Vec::new();
            for o in r.operations.get_ref() {
                if o.get_ref() == "*" {
                    operations.extend(Operation::ALL);
                } else {
                    operations.push(o.get_ref().parse::<Operation>().map_err(|e| at(o.span(), e.to_string()))?);
                }
            }
            for k in &r.keys {
                let glob = k.get_ref();
                let ok = !glob.is_empty()
                    && glob.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-*?".contains(&b));
                if !ok {
                    return Err(at(k.span(), format!("key glob {glob:?} may only use a-z 0-9 . _ - * ?")));
                }
            }
            if clients.is_empty() {
                return Err(at(r.clients.span(), "clients must not be empty".into()));
            }
            if operations.is_empty() {
                return Err(at(r.operations.span(), "operations must not be empty".into()));
            }
            rules.push(Rule {
                name,
                clients,
                keys: r.keys.into_iter().map(|k| Glob(k.into_inner())).collect(),
                operations,
                owner_only: r.owner_only,
            });
        }
        self.rules.extend(rules);
        self.files.push(path.to_owned());
        self.warnings.extend(warnings);
        Ok(())
    }

    /// Decides whether `who` may do `op` on `key` (owned by `owner`; `None` = no such record
    /// yet, which an owner-only rule lets only the operations that make one have: create and
    /// seal). An owner-only rule matches a local client by uid and a TLS client by its
    /// certificate identity ([`Owner`]). Operations without a key (quote, random, admin) pass
    /// `key = None` and match rules with no `keys` or with `"*"`.
    pub fn decide(&self, who: &Identity, op: Operation, key: Option<&KeyName>, owner: Option<&Owner>) -> Decision {
        for rule in &self.rules {
            if !rule.operations.contains(&op) || !rule.clients.iter().any(|c| c.matches(who)) {
                continue;
            }
            let key_ok = match key {
                Some(k) => rule.keys.iter().any(|g| g.matches(k.as_str())),
                None => rule.keys.is_empty() || rule.keys.iter().any(|g| g.0 == "*"),
            };
            if !key_ok {
                continue;
            }
            if rule.owner_only {
                let mine = match (who, owner) {
                    (Identity::Unix(p), Some(Owner::Uid(o))) => p.uid == *o,
                    (Identity::Cert { subject }, Some(Owner::Certificate(o))) => subject == o,
                    (_, None) => matches!(op, Operation::Create | Operation::Seal),
                    _ => false,
                };
                if !mine {
                    continue;
                }
            }
            return Decision::Allow(rule.name.clone());
        }
        Decision::Deny
    }

    /// True if any rule is owner-only (only then does a decision need the key's owner).
    pub fn has_owner_rules(&self) -> bool {
        self.rules.iter().any(|r| r.owner_only)
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Files the rules came from.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// What loaded but is probably a mistake (a user or group the system does not know), one
    /// line each naming file, line and rule.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UnixIdentity;

    fn unix(uid: u32, user: &str, groups: &[(u32, &str)]) -> Identity {
        Identity::Unix(UnixIdentity {
            uid,
            gid: groups.first().map_or(uid, |g| g.0),
            pid: None,
            user: Some(user.into()),
            groups: groups.iter().map(|(i, n)| (*i, n.to_string())).collect(),
            groups_source: crate::auth::GroupsSource::Nss,
        })
    }

    fn policy(text: &str) -> Policy {
        let mut p = Policy::default();
        p.add_file(Path::new("t.toml"), text).unwrap_or_else(|e| panic!("{e}"));
        p
    }

    fn k(s: &str) -> KeyName {
        KeyName::try_from(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn deny_by_default_and_first_matching_rule_wins() {
        let p = policy(
            r#"
            [[rule]]
            name = "web"
            clients = ["user:www-data"]
            keys = ["web-*"]
            operations = ["sign", "public"]
            [[rule]]
            name = "admins"
            clients = ["uid:0", "group:tpm-vault"]
            keys = ["*"]
            operations = ["*"]
            "#,
        );
        let www = unix(33, "www-data", &[(33, "www-data")]);
        assert_eq!(
            p.decide(&www, Operation::Sign, Some(&k("web-1")), Some(&Owner::Uid(0))),
            Decision::Allow("web".into())
        );
        assert_eq!(p.decide(&www, Operation::Delete, Some(&k("web-1")), Some(&Owner::Uid(0))), Decision::Deny);
        assert_eq!(p.decide(&www, Operation::Sign, Some(&k("db")), Some(&Owner::Uid(0))), Decision::Deny);
        assert_eq!(p.decide(&www, Operation::Quote, None, None), Decision::Deny);
        let ops = unix(1000, "alice", &[(1000, "alice"), (990, "tpm-vault")]);
        assert_eq!(
            p.decide(&ops, Operation::Delete, Some(&k("db")), Some(&Owner::Uid(0))),
            Decision::Allow("admins".into())
        );
        assert_eq!(p.decide(&ops, Operation::Quote, None, None), Decision::Allow("admins".into()));
        let nobody = unix(65534, "nobody", &[(65534, "nogroup")]);
        for op in Operation::ALL {
            assert_eq!(p.decide(&nobody, op, Some(&k("web-1")), Some(&Owner::Uid(0))), Decision::Deny);
        }
    }

    #[test]
    fn owner_only_rules_follow_the_creator() {
        let p = policy(
            r#"
            [[rule]]
            clients = ["any"]
            keys = ["*"]
            operations = ["create", "sign", "delete"]
            owner_only = true
            "#,
        );
        let alice = unix(1000, "alice", &[]);
        assert!(matches!(p.decide(&alice, Operation::Create, Some(&k("a")), None), Decision::Allow(_)));
        assert!(matches!(
            p.decide(&alice, Operation::Sign, Some(&k("a")), Some(&Owner::Uid(1000))),
            Decision::Allow(_)
        ));
        assert_eq!(p.decide(&alice, Operation::Sign, Some(&k("b")), Some(&Owner::Uid(1001))), Decision::Deny);
        // Replacing someone else's record is not creating one.
        assert_eq!(p.decide(&alice, Operation::Create, Some(&k("b")), Some(&Owner::Uid(1001))), Decision::Deny);
        // Only operations that make a record may act on a name nobody owns yet.
        assert_eq!(p.decide(&alice, Operation::Sign, Some(&k("c")), None), Decision::Deny);
        // A TLS client owns what it created by its certificate identity; no uid (root's
        // included) owns that, and the certificate owns no uid's record.
        let agent = Identity::Cert { subject: "CN=agent-1".into() };
        let by_agent = Owner::Certificate("CN=agent-1".into());
        assert!(matches!(p.decide(&agent, Operation::Sign, Some(&k("d")), Some(&by_agent)), Decision::Allow(_)));
        let other_agent = Identity::Cert { subject: "CN=agent-2".into() };
        assert_eq!(p.decide(&other_agent, Operation::Sign, Some(&k("d")), Some(&by_agent)), Decision::Deny);
        let root = unix(0, "root", &[(0, "root")]);
        assert_eq!(p.decide(&root, Operation::Sign, Some(&k("d")), Some(&by_agent)), Decision::Deny);
        assert_eq!(p.decide(&agent, Operation::Sign, Some(&k("a")), Some(&Owner::Uid(0))), Decision::Deny);
        let (uid, _) = by_agent.to_fields();
        assert_eq!(p.decide(&agent, Operation::Sign, Some(&k("a")), Some(&Owner::Uid(uid))), Decision::Deny);
    }

    #[test]
    fn bad_files_name_line_and_reason() {
        let mut p = Policy::default();
        let e = p.add_file(Path::new("x.toml"), "[[rule]]\nclients = [\"any\"]\noperations = [\"fly\"]\n");
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("x.toml: line 3: ") && msg.contains("unknown operation \"fly\""), "{msg}");
        let e = p.add_file(Path::new("y.toml"), "[[rule]]\nclients = [\"any\"\n");
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("y.toml") && msg.contains("line"), "{msg}");
        let e = p.add_file(Path::new("z.toml"), "[[rule]]\nclients = [\"root\"]\noperations = [\"sign\"]\n");
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.starts_with("policy z.toml: line 2: rule \"z.toml#1\": unknown client \"root\""), "{msg}");
        let e = p.add_file(
            Path::new("w.toml"),
            "[[rule]]\nclients = [\"any\"]\nkeys = [\"../*\"]\noperations = [\"sign\"]\n",
        );
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("w.toml: line 3: ") && msg.contains("key glob \"../*\""), "{msg}");
        let e = p.add_file(Path::new("v.toml"), "\n[[rule]]\nname = \"r\"\nclients = []\noperations = [\"sign\"]\n");
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(msg, "policy v.toml: line 4: rule \"r\": clients must not be empty");
        assert!(p.is_empty(), "nothing from failed files is kept");
    }

    #[test]
    fn globs() {
        let g = |p: &str, t: &str| Glob(p.into()).matches(t);
        assert!(g("*", "anything"));
        assert!(g("web-*", "web-1"));
        assert!(!g("web-*", "web"));
        assert!(g("a?c", "abc"));
        assert!(!g("a?c", "abbc"));
        assert!(g("*-prod-*", "db-prod-1"));
        assert!(!g("web", "web-1"));
    }

    #[test]
    fn users_and_groups_the_system_lacks_load_with_a_warning() {
        let p = policy(
            "[[rule]]\nname = \"typo\"\nclients = [\"user:root\",\n  \"user:doesnotexist-4711\", \"group:nogroup-4711\"]\n\
             operations = [\"sign\"]\n",
        );
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.warnings(),
            [
                "t.toml: line 4: rule \"typo\": no user \"doesnotexist-4711\" on this system",
                "t.toml: line 4: rule \"typo\": no group \"nogroup-4711\" on this system",
            ]
        );
        assert!(policy("[[rule]]\nclients = [\"user:root\", \"group:root\"]\noperations = [\"sign\"]\n")
            .warnings()
            .is_empty());
    }

    #[test]
    fn the_default_directory_missing_means_the_built_in_policy() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = dir.path().join("policies");
        let p = Policy::load(&missing, false).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.is_builtin() && p.len() == 1);
        let root = unix(0, "root", &[(0, "root")]);
        assert_eq!(
            p.decide(&root, Operation::Sign, Some(&k("any")), Some(&Owner::Uid(0))),
            Decision::Allow("administrators".into())
        );
        let nobody = unix(65534, "nobody", &[(65534, "nogroup")]);
        assert_eq!(p.decide(&nobody, Operation::Public, Some(&k("any")), Some(&Owner::Uid(0))), Decision::Deny);
        // Configured explicitly, a missing directory stays an error.
        let err = Policy::load(&missing, true).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("cannot read policy directory"), "{err}");
        // An existing default directory is read as usual.
        std::fs::create_dir(&missing).unwrap_or_else(|e| panic!("{e}"));
        let p = Policy::load(&missing, false).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.is_builtin() && p.is_empty());
    }

    /// Issue #31 item 1: the socket's group `tpm-vault` lets a client connect and grants
    /// nothing; only root and the admin group `tpm-vault-admin` may administer.
    #[test]
    fn the_default_policy_gives_the_socket_group_nothing() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let builtin = Policy::load(&dir.path().join("policies"), false).unwrap_or_else(|e| panic!("{e}"));
        // The file the packages install is the same text.
        let shipped = policy(include_str!("../../../policies/default.toml"));
        let www = unix(33, "www-data", &[(33, "www-data"), (990, "tpm-vault")]);
        let admin = unix(1000, "alice", &[(1000, "alice"), (990, "tpm-vault"), (991, "tpm-vault-admin")]);
        for p in [&builtin, &shipped] {
            for op in Operation::ALL {
                assert_eq!(
                    p.decide(&www, op, Some(&k("web")), Some(&Owner::Uid(0))),
                    Decision::Deny,
                    "a member of the socket group with no rule of its own may {op:?}"
                );
                assert_eq!(
                    p.decide(&admin, op, Some(&k("web")), Some(&Owner::Uid(0))),
                    Decision::Allow("administrators".into())
                );
            }
        }
    }
}
