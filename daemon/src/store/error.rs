//! The state directory's error type; its own file so that the daemon's [`crate::error::Error`],
//! which folds it in, depends on nothing else of the store.

use std::io;
use std::path::PathBuf;

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
