//! The state directory: key records, the recorded SRK name, and nothing else.
//!
//! Layout under the state dir:
//! - `srk.name`: the SRK's TPM name (hex), recorded at first start, checked at every start.
//! - `keys/<name>.key`: one JSON [`KeyRecord`] per key (TPM-wrapped blobs plus metadata).
//! - `ak.key`: the attestation key's record (restricted ECC P-256 signing key).
//! - `sealed/<name>.sealed`: one JSON [`SealedRecord`] per sealed secret (sealed-object blobs
//!   and the AES-256-GCM ciphertext, stored together so they change atomically).
//! - `datakeys/<name>.datakey`: one JSON [`DataKeyRecord`] per data key (a TPM-sealed 256-bit
//!   AES key for in-core bulk encryption).
//! - `*/.tmp-*`: in-flight writes; removed at open (a crash leaves at most these behind).
//!
//! Every write is atomic and durable (temp file, fsync, rename or link, fsync dir): after a
//! crash a record is either entirely there or entirely absent. All functions block; async
//! callers run them on the blocking pool. Owns no TPM logic.

pub mod atomic;
pub mod record;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use record::{DataKeyRecord, KeyRecord, PcrPolicy, PqSection, SealPolicy, SealedBlob, SealedRecord};

use crate::model::KeyName;

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
    /// A file exists but does not hold a valid record.
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

/// Handle to the state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    keys: PathBuf,
    sealed: PathBuf,
    datakeys: PathBuf,
    /// Held by every write of a sealed record, so that a read-modify-write
    /// ([`Store::raise_min_policy_version`]) never undoes a concurrent seal or delete.
    sealed_writes: Arc<Mutex<()>>,
}

const KEY_SUFFIX: &str = ".key";
const SEALED_SUFFIX: &str = ".sealed";
const DATAKEY_SUFFIX: &str = ".datakey";
const SRK_FILE: &str = "srk.name";

impl Store {
    /// Opens (creating if needed, mode 0700) the state directory and removes leftovers of
    /// interrupted writes.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directories cannot be created or read.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        let keys = root.join("keys");
        let sealed = root.join("sealed");
        let datakeys = root.join("datakeys");
        atomic::create_private_dir(&root).map_err(StoreError::io(&root))?;
        for dir in [&root, &keys, &sealed, &datakeys] {
            atomic::create_private_dir(dir).map_err(StoreError::io(dir))?;
            let removed = atomic::remove_temp_files(dir).map_err(StoreError::io(dir))?;
            if removed > 0 {
                tracing::info!(removed, dir = %dir.display(), "removed leftovers of interrupted writes");
            }
        }
        Ok(Self { root, keys, sealed, datakeys, sealed_writes: Arc::default() })
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SRK name recorded at first start, if any.
    ///
    /// # Errors
    /// [`StoreError::Io`] / [`StoreError::Corrupt`].
    pub fn srk_name(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.root.join(SRK_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                hex::decode(text.trim()).map(Some).map_err(|e| StoreError::Corrupt { path, reason: e.to_string() })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    /// Records the SRK name.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn set_srk_name(&self, name: &[u8]) -> Result<(), StoreError> {
        let text = format!("{}\n", hex::encode(name));
        atomic::write(&self.root, SRK_FILE, text.as_bytes(), atomic::Mode::Replace).map_err(StoreError::io(&self.root))
    }

    /// Stores a new key record; fails if one with the same name exists (atomically: two racing
    /// creates cannot both succeed).
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn insert_new(&self, record: &KeyRecord) -> Result<(), StoreError> {
        self.put(&self.keys, KEY_SUFFIX, &record.name, &record.to_bytes(), atomic::Mode::NoClobber)
    }

    /// Replaces an existing key record (e.g. to attach a certificate).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn replace(&self, record: &KeyRecord) -> Result<(), StoreError> {
        self.put(&self.keys, KEY_SUFFIX, &record.name, &record.to_bytes(), atomic::Mode::Replace)
    }

    /// Reads a key record; `None` if there is none.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn get(&self, name: &KeyName) -> Result<Option<KeyRecord>, StoreError> {
        self.read(&self.keys, KEY_SUFFIX, name, KeyRecord::from_bytes)
    }

    /// Deletes a key record durably. Returns false if there was none.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn remove(&self, name: &KeyName) -> Result<bool, StoreError> {
        self.delete(&self.keys, KEY_SUFFIX, name)
    }

    /// Key names in order, starting after `after`, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn list(&self, after: Option<&KeyName>, limit: usize) -> Result<Vec<KeyName>, StoreError> {
        let mut names = self.names(&self.keys, KEY_SUFFIX)?;
        names.sort_unstable();
        let start = match after {
            Some(a) => names.partition_point(|n| n <= a),
            None => 0,
        };
        Ok(names.into_iter().skip(start).take(limit).collect())
    }

    /// Number of stored keys.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn count(&self) -> Result<usize, StoreError> {
        Ok(self.names(&self.keys, KEY_SUFFIX)?.len())
    }

    /// The attestation key's record, if one was created.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn attestation_key(&self) -> Result<Option<KeyRecord>, StoreError> {
        self.read(&self.root, KEY_SUFFIX, &ak_name(), KeyRecord::from_bytes)
    }

    /// Records the attestation key; fails if one exists (it is created once).
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn insert_attestation_key(&self, record: &KeyRecord) -> Result<(), StoreError> {
        self.put(&self.root, KEY_SUFFIX, &ak_name(), &record.to_bytes(), atomic::Mode::NoClobber)
    }

    /// Stores a sealed secret, replacing an existing one only if `overwrite`.
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn put_sealed(&self, record: &SealedRecord, overwrite: bool) -> Result<(), StoreError> {
        let mode = if overwrite { atomic::Mode::Replace } else { atomic::Mode::NoClobber };
        let _writing = self.lock_sealed_writes();
        self.put(&self.sealed, SEALED_SUFFIX, &record.name, &record.to_bytes(), mode)
    }

    /// The sealed-record write lock (a panic while it was held leaves nothing to repair: every
    /// write under it is atomic on disk).
    fn lock_sealed_writes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.sealed_writes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Raises the lowest approval version an authorized-policy secret accepts to `version`,
    /// re-reading the record under the sealed-record lock: nothing is written unless the
    /// record is still the sealed object `tpm_name` (not re-sealed or deleted meanwhile) and
    /// its minimum is lower, so the minimum never goes down. Returns whether it wrote.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn raise_min_policy_version(&self, name: &KeyName, tpm_name: &[u8], version: u64) -> Result<bool, StoreError> {
        let _writing = self.lock_sealed_writes();
        let Some(mut record) = self.get_sealed(name)? else { return Ok(false) };
        if record.tpm_name != tpm_name {
            return Ok(false);
        }
        match &mut record.policy {
            SealPolicy::Authorized { min_policy_version, .. } if *min_policy_version < version => {
                *min_policy_version = version;
            }
            _ => return Ok(false),
        }
        self.put(&self.sealed, SEALED_SUFFIX, &record.name, &record.to_bytes(), atomic::Mode::Replace)?;
        Ok(true)
    }

    /// Reads a sealed secret; `None` if there is none.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn get_sealed(&self, name: &KeyName) -> Result<Option<SealedRecord>, StoreError> {
        self.read(&self.sealed, SEALED_SUFFIX, name, SealedRecord::from_bytes)
    }

    /// Deletes a sealed secret durably. Returns false if there was none.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn remove_sealed(&self, name: &KeyName) -> Result<bool, StoreError> {
        let _writing = self.lock_sealed_writes();
        self.delete(&self.sealed, SEALED_SUFFIX, name)
    }

    /// Stores a new data key; fails if one with the same name exists.
    ///
    /// # Errors
    /// [`StoreError::Exists`], [`StoreError::Io`].
    pub fn insert_datakey(&self, record: &DataKeyRecord) -> Result<(), StoreError> {
        self.put(&self.datakeys, DATAKEY_SUFFIX, &record.name, &record.to_bytes(), atomic::Mode::NoClobber)
    }

    /// Reads a data key; `None` if there is none.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    pub fn get_datakey(&self, name: &KeyName) -> Result<Option<DataKeyRecord>, StoreError> {
        self.read(&self.datakeys, DATAKEY_SUFFIX, name, DataKeyRecord::from_bytes)
    }

    /// Deletes a data key durably. Returns false if there was none.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn remove_datakey(&self, name: &KeyName) -> Result<bool, StoreError> {
        self.delete(&self.datakeys, DATAKEY_SUFFIX, name)
    }

    fn path(dir: &Path, suffix: &str, name: &KeyName) -> PathBuf {
        dir.join(format!("{name}{suffix}"))
    }

    fn put(
        &self,
        dir: &Path,
        suffix: &str,
        name: &KeyName,
        bytes: &[u8],
        mode: atomic::Mode,
    ) -> Result<(), StoreError> {
        match atomic::write(dir, &format!("{name}{suffix}"), bytes, mode) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(StoreError::Exists(name.clone())),
            Err(e) => Err(StoreError::Io { path: Self::path(dir, suffix, name), source: e }),
        }
    }

    fn read<T>(
        &self,
        dir: &Path,
        suffix: &str,
        name: &KeyName,
        parse: impl FnOnce(&[u8], &KeyName) -> Result<T, String>,
    ) -> Result<Option<T>, StoreError> {
        let path = Self::path(dir, suffix, name);
        match std::fs::read(&path) {
            Ok(bytes) => parse(&bytes, name).map(Some).map_err(|reason| StoreError::Corrupt { path, reason }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    fn delete(&self, dir: &Path, suffix: &str, name: &KeyName) -> Result<bool, StoreError> {
        let path = Self::path(dir, suffix, name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                atomic::sync_dir(dir).map_err(StoreError::io(dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    fn names(&self, dir: &Path, suffix: &str) -> Result<Vec<KeyName>, StoreError> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(StoreError::io(dir))? {
            let entry = entry.map_err(StoreError::io(dir))?;
            let file = entry.file_name();
            let Some(stem) = file.to_str().and_then(|f| f.strip_suffix(suffix)) else { continue };
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
            policy: SealPolicy::Authorized {
                selection: PcrSelection::new(PcrBank::Sha256, &[9]).unwrap_or_else(|e| panic!("{e}")),
                authority_spki: vec![1, 2, 3],
                min_policy_version: min,
            },
            policy_digest: vec![0; 32],
            tpm_name: tpm_name.to_vec(),
            public: vec![4],
            private: vec![5],
            nonce: vec![6; 12],
            ciphertext: vec![7; 16],
        }
    }

    fn min_version(store: &Store, name: &KeyName) -> Option<u64> {
        match store.get_sealed(name).unwrap_or_else(|e| panic!("{e}"))?.policy {
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
        store.put_sealed(&authorized(&name, b"old", 0), false).unwrap_or_else(|e| panic!("{e}"));
        assert!(raise(b"old", 5));
        assert_eq!(min_version(&store, &name), Some(5));
        // An unseal that read the record before the raise to 5 and used approval 3 lowers nothing.
        assert!(!raise(b"old", 3));
        assert_eq!(min_version(&store, &name), Some(5));
        // Re-sealed meanwhile (a new sealed object): the raise belongs to the old one.
        store.put_sealed(&authorized(&name, b"new", 0), true).unwrap_or_else(|e| panic!("{e}"));
        assert!(!raise(b"old", 9));
        let record = store.get_sealed(&name).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("gone"));
        assert_eq!((record.tpm_name.as_slice(), min_version(&store, &name)), (&b"new"[..], Some(0)));
        // Deleted meanwhile: the raise does not bring it back.
        assert!(store.remove_sealed(&name).unwrap_or_else(|e| panic!("{e}")));
        assert!(!raise(b"new", 9));
        assert!(store.get_sealed(&name).unwrap_or_else(|e| panic!("{e}")).is_none());
    }
}
