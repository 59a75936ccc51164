//! The state directory: key records, the recorded SRK name, and nothing else.
//!
//! Layout under the state dir:
//! - `srk.name`: the SRK's TPM name (hex), recorded at first start, checked at every start.
//! - `keys/<name>.key`: one JSON [`KeyRecord`] per key (TPM-wrapped blobs plus metadata).
//! - `ak.key`: the attestation key's record (restricted ECC P-256 signing key); `ak-rsa.key`:
//!   the RSA 2048 one, created when first asked for (the Keylime agent uses it).
//! - `sealed/<name>.sealed`: one JSON [`SealedRecord`] per sealed secret (sealed-object blobs
//!   and the AES-256-GCM ciphertext, stored together so they change atomically).
//! - `datakeys/<name>.datakey`: one JSON [`DataKeyRecord`] per data key (a TPM-sealed 256-bit
//!   AES key for in-core bulk encryption).
//! - `*/.tmp-*`: in-flight writes; removed at open (a crash leaves at most these behind).
//!
//! Every write is atomic and durable (temp file, fsync, rename or link, fsync dir): after a
//! crash a record is either entirely there or entirely absent. The directory is trusted only
//! when nobody but the daemon's user (and root) can change it, and every file in it is read
//! without following links, only if it is a regular file within its kind's size cap
//! ([`trust`]). Writes to one kind of record are serialised by that table's write lock, under
//! which a write that must not land on someone else's record ([`Table::replace_checked`],
//! [`Table::remove_checked`]) checks the owner of the record on disk with the caller's
//! [`OwnerCheck`]. All functions block; async callers run them on the blocking pool. Owns no
//! TPM logic.

pub mod atomic;
pub mod record;
pub mod trust;

use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use record::{DataKeyRecord, KeyRecord, PcrPolicy, PqSection, Record, SealPolicy, SealedRecord, TpmObject};

use crate::model::{KeyName, Owner};

/// Why a state-directory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A key record with this name already exists.
    #[error("key {0} already exists")]
    Exists(KeyName),
    /// Reading or writing a file failed (disk full, read-only file system, permissions).
    #[error("state directory I/O on {path}: {source}")]
    Io {
        /// File or directory involved.
        path: PathBuf,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The state directory, or a directory above it, may be changed by someone other than the
    /// daemon's user and root (or a record directory is a symbolic link): the daemon refuses
    /// to start.
    #[error("unsafe state directory {dir}: {path} {reason}")]
    Unsafe {
        /// The state directory.
        dir: PathBuf,
        /// The directory at fault (the state directory or one above or inside it).
        path: PathBuf,
        /// What is wrong, and how to fix it.
        reason: String,
    },
    /// A checked write ([`Table::replace_checked`], [`Table::remove_checked`]) was refused: the
    /// record on disk now (its owner, or the policy in force) no longer allows it.
    #[error("{name}: the record's owner or the access policy changed while the request ran")]
    Refused {
        /// The record.
        name: KeyName,
    },
    /// A file exists but does not hold a valid record (or is not a regular file within its
    /// kind's size cap).
    #[error("corrupt state file {path}: {reason}")]
    Corrupt {
        /// File involved.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl StoreError {
    fn io(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Io { path: path.to_owned(), source }
    }
}

/// Decides whether a checked write may go ahead, given the owner of the record on disk when
/// the table's write lock is held (`None`: there is none, or it does not parse, so no owner can
/// be shown). The RPC layer makes one that repeats the caller's policy decision.
pub struct OwnerCheck(Box<dyn Allows>);

/// The decision of an [`OwnerCheck`]: whether a write may go ahead over a record of `owner`.
trait Allows: Fn(Option<&Owner>) -> bool + Send + Sync {}

impl<F: Fn(Option<&Owner>) -> bool + Send + Sync> Allows for F {}

impl OwnerCheck {
    /// A check deciding with `allows`.
    pub fn new(allows: impl Fn(Option<&Owner>) -> bool + Send + Sync + 'static) -> Self {
        Self(Box::new(allows))
    }

    /// A check that allows every write (embedding, tests, and the vault's own writes).
    pub fn any() -> Self {
        Self::new(|_| true)
    }

    fn allows(&self, owner: Option<&Owner>) -> bool {
        (self.0)(owner)
    }
}

impl std::fmt::Debug for OwnerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerCheck").finish_non_exhaustive()
    }
}

/// Handle to the state directory: one [`Table`] per record kind.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Records a listing skipped because they do not parse (`tpm_vault_store_corrupt_records_total`).
    corrupt: Arc<AtomicU64>,
    keys: Table<KeyRecord>,
    sealed: Table<SealedRecord>,
    datakeys: Table<DataKeyRecord>,
    /// The attestation key's record, `ak.key` in the state dir itself.
    attestation: Table<KeyRecord>,
}

const SRK_FILE: &str = "srk.name";
/// The largest `srk.name` (a TPM name in hex is under 140 characters).
const MAX_SRK_FILE: u64 = 1024;

/// Creates the state directory if it is missing (mode 0700) and checks that it can be trusted
/// ([`trust`]): the daemon does this before anything else touches the directory.
///
/// # Errors
/// [`StoreError::Unsafe`] naming the directory at fault; [`StoreError::Io`] if it cannot be
/// created or examined.
pub fn check_state_dir(root: &Path) -> Result<(), StoreError> {
    atomic::create_private_dir(root).map_err(StoreError::io(root))?;
    trust::check_dir(root)
}

/// The record directories inside the state directory.
const RECORD_DIRS: [&str; 3] = ["keys", "sealed", "datakeys"];

/// What [`check_state_dir`] and [`Store::open`] check of the state directory and its record
/// directories, for `--check-config`: nothing is created ([`trust::check_existing`]).
///
/// # Errors
/// [`StoreError::Unsafe`] naming the directory at fault; [`StoreError::Io`] if one cannot be
/// examined.
pub fn check_state_dir_unchanged(root: &Path) -> Result<(), StoreError> {
    trust::check_existing(root, &RECORD_DIRS)
}

impl Store {
    /// Opens (creating if needed, mode 0700) the state directory after checking it can be
    /// trusted ([`check_state_dir`]), removes leftovers of interrupted writes and reports files
    /// that are not regular files.
    ///
    /// # Errors
    /// [`StoreError::Unsafe`] for a state directory others may change; [`StoreError::Io`] if
    /// the directories cannot be created or read.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        // Every kind's writes are serialised: checked writes read the record's owner under the
        // lock, and sealed records have a read-modify-write (`raise_min_policy_version`) that
        // must never undo a concurrent seal or delete.
        let [keys, sealed, datakeys] = RECORD_DIRS;
        let keys = Table::new(root.join(keys), ".key", true);
        let sealed = Table::new(root.join(sealed), ".sealed", true);
        let datakeys = Table::new(root.join(datakeys), ".datakey", true);
        let attestation = Table::new(root.clone(), ".key", false);
        check_state_dir(&root)?;
        for (dir, suffix) in
            [(&root, ".key"), (&keys.dir, keys.suffix), (&sealed.dir, sealed.suffix), (&datakeys.dir, datakeys.suffix)]
        {
            atomic::create_private_dir(dir).map_err(StoreError::io(dir))?;
            if dir != &root {
                trust::check_subdir(&root, dir)?;
            }
            let swept = trust::sweep(dir, suffix)?;
            if swept.removed > 0 {
                tracing::info!(removed = swept.removed, dir = %dir.display(), "removed leftovers of interrupted writes");
            }
        }
        Ok(Self { root, corrupt: Arc::default(), keys, sealed, datakeys, attestation })
    }

    /// Counts a record that a listing skipped because it does not parse.
    pub fn count_corrupt(&self) {
        self.corrupt.fetch_add(1, Ordering::Relaxed);
    }

    /// Records listings skipped because they do not parse, since the daemon started.
    pub fn corrupt_records(&self) -> u64 {
        self.corrupt.load(Ordering::Relaxed)
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Signing (and ML-KEM) keys: `keys/<name>.key`.
    pub fn keys(&self) -> &Table<KeyRecord> {
        &self.keys
    }

    /// Sealed secrets: `sealed/<name>.sealed`.
    pub fn sealed(&self) -> &Table<SealedRecord> {
        &self.sealed
    }

    /// Data keys: `datakeys/<name>.datakey`.
    pub fn datakeys(&self) -> &Table<DataKeyRecord> {
        &self.datakeys
    }

    /// The SRK name recorded at first start, if any.
    ///
    /// # Errors
    /// [`StoreError::Io`] / [`StoreError::Corrupt`].
    pub fn srk_name(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.root.join(SRK_FILE);
        let Some(bytes) = trust::read(&path, MAX_SRK_FILE)? else { return Ok(None) };
        let text = String::from_utf8_lossy(&bytes);
        hex::decode(text.trim()).map(Some).map_err(|e| StoreError::Corrupt { path, reason: e.to_string() })
    }

    /// Records the SRK name.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn set_srk_name(&self, name: &[u8]) -> Result<(), StoreError> {
        let text = format!("{}\n", hex::encode(name));
        atomic::write(&self.root, SRK_FILE, text.as_bytes(), atomic::Mode::Replace).map_err(StoreError::io(&self.root))
    }

    /// An attestation key's record (`ak` or `ak-rsa`), if one was created.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn attestation_key(&self, name: &KeyName) -> Result<Option<KeyRecord>, StoreError> {
        self.attestation.get(name)
    }

    /// Records an attestation key (named [`ak_name`], or `ak-rsa` for the RSA one); fails if
    /// one exists (each is created once).
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn insert_attestation_key(&self, record: &KeyRecord) -> Result<(), StoreError> {
        self.attestation.insert(record)
    }

    /// Raises the lowest approval version an authorized-policy secret accepts to `version`,
    /// re-reading the record under the sealed table's write lock: nothing is written unless the
    /// record is still the sealed object `tpm_name` (not re-sealed or deleted meanwhile) and
    /// its minimum is lower, so the minimum never goes down. Returns whether it wrote.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn raise_min_policy_version(&self, name: &KeyName, tpm_name: &[u8], version: u64) -> Result<bool, StoreError> {
        let _writing = self.sealed.lock_writes();
        let Some(mut record) = self.sealed.get(name)? else { return Ok(false) };
        if record.object.tpm_name != tpm_name {
            return Ok(false);
        }
        match &mut record.policy {
            SealPolicy::Authorized { min_policy_version, .. } if *min_policy_version < version => {
                *min_policy_version = version;
            }
            _ => return Ok(false),
        }
        self.sealed.write(&record, atomic::Mode::Replace)?;
        Ok(true)
    }
}

/// The records of one kind, one file each (`<dir>/<name><suffix>`): every kind has the same
/// vocabulary (insert, replace, get, remove, list).
#[derive(Debug)]
pub struct Table<R> {
    dir: PathBuf,
    suffix: &'static str,
    /// Held by every write when the kind has a read-modify-write of its own (sealed records).
    writes: Option<Arc<Mutex<()>>>,
    kind: PhantomData<fn() -> R>,
}

impl<R> Clone for Table<R> {
    fn clone(&self) -> Self {
        Self { dir: self.dir.clone(), suffix: self.suffix, writes: self.writes.clone(), kind: PhantomData }
    }
}

impl<R: Record> Table<R> {
    fn new(dir: PathBuf, suffix: &'static str, serialized_writes: bool) -> Self {
        Self { dir, suffix, writes: serialized_writes.then(Arc::default), kind: PhantomData }
    }

    /// Stores a new record; fails if one with the same name exists (atomically: two racing
    /// creates cannot both succeed).
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn insert(&self, record: &R) -> Result<(), StoreError> {
        let _writing = self.lock_writes();
        self.write(record, atomic::Mode::NoClobber)
    }

    /// Stores a record, replacing one with the same name if there is one.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn replace(&self, record: &R) -> Result<(), StoreError> {
        let _writing = self.lock_writes();
        self.write(record, atomic::Mode::Replace)
    }

    /// [`Table::replace`] when `check` allows it for the owner of the record on disk now,
    /// checked under the write lock (so no other write lands between the check and this one).
    ///
    /// # Errors
    /// [`StoreError::Refused`], [`StoreError::Io`].
    pub fn replace_checked(&self, record: &R, check: &OwnerCheck) -> Result<(), StoreError> {
        let _writing = self.lock_writes();
        self.check_owner(record.name(), check)?;
        self.write(record, atomic::Mode::Replace)
    }

    /// [`Table::remove`] when `check` allows it for the owner of the record on disk now,
    /// checked under the write lock. Returns false if there was none.
    ///
    /// # Errors
    /// [`StoreError::Refused`], [`StoreError::Io`].
    pub fn remove_checked(&self, name: &KeyName, check: &OwnerCheck) -> Result<bool, StoreError> {
        let _writing = self.lock_writes();
        if !self.path(name).exists() {
            return Ok(false);
        }
        self.check_owner(name, check)?;
        self.remove_locked(name)
    }

    /// Reads a record; `None` if there is none.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn get(&self, name: &KeyName) -> Result<Option<R>, StoreError> {
        let path = self.path(name);
        let Some(bytes) = trust::read(&path, R::MAX_FILE)? else { return Ok(None) };
        R::from_bytes(&bytes, name).map(Some).map_err(|reason| StoreError::Corrupt { path, reason })
    }

    /// Deletes a record durably. Returns false if there was none.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn remove(&self, name: &KeyName) -> Result<bool, StoreError> {
        let _writing = self.lock_writes();
        self.remove_locked(name)
    }

    /// Runs `check` on the owner of the record `name` on disk (the caller holds the write
    /// lock). A record that does not parse shows no owner (`None`).
    fn check_owner(&self, name: &KeyName, check: &OwnerCheck) -> Result<(), StoreError> {
        let owner = match self.get(name) {
            Ok(record) => record.map(|r| r.owner()),
            Err(StoreError::Corrupt { .. }) => None,
            Err(e) => return Err(e),
        };
        if check.allows(owner.as_ref()) {
            Ok(())
        } else {
            Err(StoreError::Refused { name: name.clone() })
        }
    }

    fn remove_locked(&self, name: &KeyName) -> Result<bool, StoreError> {
        let path = self.path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                atomic::sync_dir(&self.dir).map_err(StoreError::io(&self.dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    /// Names in order, starting after `after`, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn list(&self, after: Option<&KeyName>, limit: usize) -> Result<Vec<KeyName>, StoreError> {
        let mut names = self.names()?;
        names.sort_unstable();
        let start = match after {
            Some(a) => names.partition_point(|n| n <= a),
            None => 0,
        };
        Ok(names.into_iter().skip(start).take(limit).collect())
    }

    /// Number of records.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn count(&self) -> Result<usize, StoreError> {
        Ok(self.names()?.len())
    }

    /// The write lock, if this kind has one (a panic while it was held leaves nothing to
    /// repair: every write under it is atomic on disk).
    fn lock_writes(&self) -> Option<MutexGuard<'_, ()>> {
        self.writes.as_ref().map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn path(&self, name: &KeyName) -> PathBuf {
        self.dir.join(format!("{name}{}", self.suffix))
    }

    fn write(&self, record: &R, mode: atomic::Mode) -> Result<(), StoreError> {
        let name = record.name();
        match atomic::write(&self.dir, &format!("{name}{}", self.suffix), &record.to_bytes(), mode) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(StoreError::Exists(name.clone())),
            Err(e) => Err(StoreError::Io { path: self.path(name), source: e }),
        }
    }

    fn names(&self) -> Result<Vec<KeyName>, StoreError> {
        let dir = &self.dir;
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(StoreError::io(dir))? {
            let entry = entry.map_err(StoreError::io(dir))?;
            // Only regular files can be records (the type comes with the directory entry; a
            // link, FIFO or directory here was reported at start).
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let file = entry.file_name();
            let Some(stem) = file.to_str().and_then(|f| f.strip_suffix(self.suffix)) else { continue };
            if let Ok(name) = KeyName::try_from(stem) {
                names.push(name);
            }
        }
        Ok(names)
    }
}

/// Name of the attestation key record (`<state-dir>/ak.key`).
pub fn ak_name() -> KeyName {
    KeyName::attestation_key()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PcrBank, PcrSelection};

    fn authorized(name: &KeyName, tpm_name: &[u8], min: u64) -> SealedRecord {
        SealedRecord {
            version: 1,
            name: name.clone(),
            created_unix: 1,
            owner_uid: 0,
            owner_certificate: None,
            policy: SealPolicy::Authorized {
                selection: PcrSelection::new(PcrBank::Sha256, &[9]).unwrap_or_else(|e| panic!("{e}")),
                authority_spki: vec![1, 2, 3],
                min_policy_version: min,
            },
            policy_digest: vec![0; 32],
            object: TpmObject { tpm_name: tpm_name.to_vec(), public: vec![4], private: vec![5] },
            nonce: vec![6; 12],
            ciphertext: vec![7; 16],
            direct: false,
        }
    }

    fn min_version(store: &Store, name: &KeyName) -> Option<u64> {
        match store.sealed().get(name).unwrap_or_else(|e| panic!("{e}"))?.policy {
            SealPolicy::Authorized { min_policy_version, .. } => Some(min_policy_version),
            SealPolicy::Pcr { .. } => None,
        }
    }

    #[test]
    fn raising_the_approval_version_never_lowers_it_or_undoes_a_reseal_or_delete() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let name = KeyName::try_from("disk").unwrap_or_else(|e| panic!("{e}"));
        let raise =
            |tpm_name: &[u8], v| store.raise_min_policy_version(&name, tpm_name, v).unwrap_or_else(|e| panic!("{e}"));
        store.sealed().insert(&authorized(&name, b"old", 0)).unwrap_or_else(|e| panic!("{e}"));
        assert!(raise(b"old", 5));
        assert_eq!(min_version(&store, &name), Some(5));
        // An unseal that read the record before the raise to 5 and used approval 3 lowers nothing.
        assert!(!raise(b"old", 3));
        assert_eq!(min_version(&store, &name), Some(5));
        // Re-sealed meanwhile (a new sealed object): the raise belongs to the old one.
        store.sealed().replace(&authorized(&name, b"new", 0)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!raise(b"old", 9));
        let record = store.sealed().get(&name).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("gone"));
        assert_eq!((record.object.tpm_name.as_slice(), min_version(&store, &name)), (&b"new"[..], Some(0)));
        // Deleted meanwhile: the raise does not bring it back.
        assert!(store.sealed().remove(&name).unwrap_or_else(|e| panic!("{e}")));
        assert!(!raise(b"new", 9));
        assert!(store.sealed().get(&name).unwrap_or_else(|e| panic!("{e}")).is_none());
    }

    #[test]
    fn checked_writes_see_the_owner_on_disk_and_refuse_what_the_check_refuses() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let name = KeyName::try_from("disk").unwrap_or_else(|e| panic!("{e}"));
        let owned_by = |uid: u32| OwnerCheck::new(move |owner| owner == Some(&Owner::Uid(uid)));
        let table = store.sealed();
        // Nothing there: a remove finds nothing, a replace sees no owner.
        assert!(!table.remove_checked(&name, &owned_by(7)).unwrap_or_else(|e| panic!("{e}")));
        let r = table.replace_checked(&authorized(&name, b"a", 0), &owned_by(7));
        assert!(matches!(r, Err(StoreError::Refused { .. })), "{r:?}");
        table
            .replace_checked(&authorized(&name, b"a", 0), &OwnerCheck::new(|o| o.is_none()))
            .unwrap_or_else(|e| panic!("{e}"));
        // Owned by uid 0 now: another owner's check refuses both writes, the owner's allows them.
        let r = table.replace_checked(&authorized(&name, b"b", 0), &owned_by(7));
        assert!(matches!(r, Err(StoreError::Refused { .. })), "{r:?}");
        assert!(matches!(table.remove_checked(&name, &owned_by(7)), Err(StoreError::Refused { .. })));
        let kept = table.get(&name).unwrap_or_else(|e| panic!("{e}")).map(|r| r.object.tpm_name);
        assert_eq!(kept.as_deref(), Some(&b"a"[..]));
        table.replace_checked(&authorized(&name, b"b", 0), &owned_by(0)).unwrap_or_else(|e| panic!("{e}"));
        assert!(table.remove_checked(&name, &owned_by(0)).unwrap_or_else(|e| panic!("{e}")));
        // A record that does not parse shows no owner.
        std::fs::write(dir.path().join("sealed/disk.sealed"), b"{").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(table.remove_checked(&name, &owned_by(0)), Err(StoreError::Refused { .. })));
        assert!(table.remove_checked(&name, &OwnerCheck::new(|o| o.is_none())).unwrap_or_else(|e| panic!("{e}")));
    }

    /// The records 0.1.0 wrote (the compatibility fixture the client's `compat` test opens with
    /// a real TPM) read back and write out byte for byte the same: the flattened TPM object and
    /// the one record trait keep the format.
    #[test]
    fn records_of_0_1_0_round_trip_byte_for_byte() {
        fn same<R: Record>(table: &Table<R>) -> usize {
            let names = table.list(None, usize::MAX).unwrap_or_else(|e| panic!("{e}"));
            for name in &names {
                let record = table.get(name).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("{name}"));
                let on_disk = std::fs::read(table.path(name)).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(String::from_utf8_lossy(&record.to_bytes()), String::from_utf8_lossy(&on_disk), "{name}");
            }
            names.len()
        }
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/tests/data/compat-v1/state");
        let copy = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for dir in ["keys", "sealed", "datakeys"] {
            std::fs::create_dir(copy.path().join(dir)).unwrap_or_else(|e| panic!("{e}"));
            for entry in std::fs::read_dir(fixture.join(dir)).unwrap_or_else(|e| panic!("{e}")) {
                let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
                let to = copy.path().join(dir).join(path.file_name().unwrap_or_default());
                std::fs::copy(&path, to).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let store = Store::open(copy.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((same(store.keys()), same(store.sealed()), same(store.datakeys())), (12, 1, 1));
    }
}
