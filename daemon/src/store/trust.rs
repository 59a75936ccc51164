//! Whether the state directory can be trusted, and how files in it are opened.
//!
//! The vault's key records decide which TPM objects the daemon loads and who owns them, so
//! whoever can write the state directory controls the vault. At start ([`check_dir`]), as
//! sshd's `StrictModes` does for `~/.ssh`:
//! - the state directory and its record directories (`keys/`, `sealed/`, `datakeys/`) must be
//!   real directories (not symbolic links) owned by the daemon's user and writable by nobody
//!   else (no group or other write bit);
//! - every directory above it must be owned by root or the daemon's user and writable by
//!   nobody else, except a root-owned directory with the sticky bit (`/tmp`): there others may
//!   add entries but not rename or remove ours.
//!
//! A state directory reached through a symbolic link (`/var/lib/tpm-vault` →
//! `private/tpm-vault` under systemd's `DynamicUser=`) is checked along both paths: the
//! directories holding the link and those holding its target.
//!
//! Every record is read with [`read`]: opened `O_NOFOLLOW | O_NONBLOCK`, then checked with
//! `fstat` on what was opened. Only a regular file no larger than its kind's cap is read, so a
//! symbolic link, FIFO, device or huge file there is refused with a warning naming it, never
//! followed, never waited on and never read into memory. [`sweep`] reports such entries at start
//! and removes what interrupted writes left behind.
//!
//! Owns no record format (see [`super::record`]) and writes nothing but those removals.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::atomic::TEMP_PREFIX;
use super::StoreError;

/// Group and other write bits.
const WRITABLE_BY_OTHERS: u32 = 0o022;
/// The sticky bit: in such a directory only an entry's owner (or the directory's) may rename
/// or remove it.
const STICKY: u32 = 0o1000;

/// Checks that the state directory `dir` (which exists) and every directory above it can be
/// changed by nobody but the daemon's user and root (see the module docs).
///
/// # Errors
/// [`StoreError::Unsafe`] naming the state directory, the offending directory and why;
/// [`StoreError::Io`] if a directory cannot be examined.
pub fn check_dir(dir: &Path) -> Result<(), StoreError> {
    let uid = nix::unistd::geteuid().as_raw();
    let given = std::path::absolute(dir).map_err(StoreError::io(dir))?;
    let real = std::fs::canonicalize(dir).map_err(StoreError::io(dir))?;
    let unsafe_because =
        |path: &Path, reason: String| StoreError::Unsafe { dir: dir.to_owned(), path: path.to_owned(), reason };
    let meta = std::fs::metadata(&real).map_err(StoreError::io(&real))?;
    if let Some(reason) = own_dir_problem(&meta, uid) {
        return Err(unsafe_because(&real, reason));
    }
    // The directories above the target, then those above the path as given (the same ones
    // unless a symbolic link is on the way).
    for above in real.ancestors().skip(1).chain(given.ancestors().skip(1)) {
        let meta = std::fs::metadata(above).map_err(StoreError::io(above))?;
        if let Some(reason) = parent_problem(&meta, uid) {
            return Err(unsafe_because(above, reason));
        }
    }
    Ok(())
}

/// The checks start-up makes ([`check_dir`], then [`check_subdir`] on each record directory in
/// `subdirs`), without creating anything (for `--check-config`): when `dir` does not exist yet,
/// the nearest directory above it that exists, and those above that, are held to the rules for
/// directories above the state directory (start-up would create it there, mode 0700).
///
/// # Errors
/// As [`check_dir`].
pub fn check_existing(dir: &Path, subdirs: &[&str]) -> Result<(), StoreError> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {
            check_dir(dir)?;
            for sub in subdirs.iter().map(|s| dir.join(s)) {
                if std::fs::symlink_metadata(&sub).is_ok() {
                    check_subdir(dir, &sub)?;
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let uid = nix::unistd::geteuid().as_raw();
            let given = std::path::absolute(dir).map_err(StoreError::io(dir))?;
            let Some(existing) = given.ancestors().skip(1).find(|a| a.exists()) else { return Ok(()) };
            let real = std::fs::canonicalize(existing).map_err(StoreError::io(existing))?;
            for above in real.ancestors().chain(existing.ancestors()) {
                let meta = std::fs::metadata(above).map_err(StoreError::io(above))?;
                if let Some(reason) = parent_problem(&meta, uid) {
                    return Err(StoreError::Unsafe { dir: dir.to_owned(), path: above.to_owned(), reason });
                }
            }
            Ok(())
        }
        Err(e) => Err(StoreError::Io { path: dir.to_owned(), source: e }),
    }
}

/// Checks a record directory inside the state directory: a real directory (a symbolic link
/// could lead the records anywhere), owned by the daemon's user, writable by nobody else.
///
/// # Errors
/// [`StoreError::Unsafe`]; [`StoreError::Io`] if it cannot be examined.
pub fn check_subdir(state_dir: &Path, sub: &Path) -> Result<(), StoreError> {
    let meta = std::fs::symlink_metadata(sub).map_err(StoreError::io(sub))?;
    let reason = if meta.file_type().is_symlink() {
        Some("is a symbolic link, not a directory".to_owned())
    } else {
        own_dir_problem(&meta, nix::unistd::geteuid().as_raw())
    };
    match reason {
        Some(reason) => Err(StoreError::Unsafe { dir: state_dir.to_owned(), path: sub.to_owned(), reason }),
        None => Ok(()),
    }
}

/// Reads the file at `path` if it is a regular file of at most `max` bytes; `None` if there is
/// none. Never follows a symbolic link and never blocks on a FIFO.
///
/// # Errors
/// [`StoreError::Corrupt`] (and a warning naming the file) for a symbolic link, anything but
/// a regular file, or a file larger than `max`; [`StoreError::Io`] for I/O errors.
pub fn read(path: &Path, max: u64) -> Result<Option<Vec<u8>>, StoreError> {
    let opened = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refuse(path, "is a symbolic link".to_owned())),
        Err(e) => return Err(StoreError::Io { path: path.to_owned(), source: e }),
    };
    let meta = file.metadata().map_err(StoreError::io(path))?;
    if !meta.file_type().is_file() {
        return Err(refuse(path, format!("is {}, not a regular file", kind(&meta.file_type()))));
    }
    if meta.len() > max {
        return Err(refuse(path, format!("has {} bytes, more than the {max} a file of its kind may have", meta.len())));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // One byte more than allowed, so a file that grew since the fstat is noticed.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(StoreError::io(path))?;
    if bytes.len() as u64 > max {
        return Err(refuse(path, format!("grew past the {max} bytes a file of its kind may have while read")));
    }
    Ok(Some(bytes))
}

/// What [`sweep`] did in one directory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Leftovers of interrupted writes removed.
    pub removed: usize,
    /// Entries reported and left alone: directories named like temp files, records that are
    /// not regular files, temp entries that could not be removed.
    pub ignored: usize,
}

/// At start, in one record directory: removes the temp files of writes a crash interrupted
/// (`.tmp-*`; a directory so named is not ours to remove: it is reported and left), and reports
/// every `*<suffix>` entry that is not a regular file (requests for it will fail). Reads only
/// the directory (the entry types come with it); never opens an entry.
///
/// # Errors
/// [`StoreError::Io`] if the directory cannot be read.
pub fn sweep(dir: &Path, suffix: &str) -> Result<Swept, StoreError> {
    let mut swept = Swept::default();
    for entry in std::fs::read_dir(dir).map_err(StoreError::io(dir))? {
        let entry = entry.map_err(StoreError::io(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        // The type of the entry itself, never of what a link points to.
        let file_type = entry.file_type().map_err(StoreError::io(&path))?;
        if name.starts_with(TEMP_PREFIX) {
            if file_type.is_dir() {
                tracing::warn!(path = %path.display(), "a directory named like a temp file in the state directory; ignored (remove it)");
                swept.ignored += 1;
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => swept.removed += 1,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover temp file; ignored");
                    swept.ignored += 1;
                }
            }
        } else if name.ends_with(suffix) && !file_type.is_file() {
            tracing::warn!(
                path = %path.display(),
                kind = kind(&file_type),
                "a state file is not a regular file; it is refused (requests for it fail) until it is removed"
            );
            swept.ignored += 1;
        }
    }
    Ok(swept)
}

/// Why a directory the daemon keeps its own files in is not safe, if it is not.
fn own_dir_problem(meta: &std::fs::Metadata, uid: u32) -> Option<String> {
    if !meta.is_dir() {
        return Some("is not a directory".to_owned());
    }
    if meta.uid() != uid {
        return Some(format!("is owned by uid {}, not by the daemon's uid {uid} (chown it)", meta.uid()));
    }
    writable_by_others(meta.mode())
}

/// Why a directory above the state directory is not safe, if it is not.
fn parent_problem(meta: &std::fs::Metadata, uid: u32) -> Option<String> {
    if meta.uid() != 0 && meta.uid() != uid {
        return Some(format!("is owned by uid {}: only root or the daemon's uid {uid} may own it", meta.uid()));
    }
    if meta.uid() == 0 && meta.mode() & STICKY != 0 {
        return None;
    }
    writable_by_others(meta.mode())
}

/// Why a mode lets others change a directory, if it does.
fn writable_by_others(mode: u32) -> Option<String> {
    if mode & WRITABLE_BY_OTHERS == 0 {
        return None;
    }
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, false) => "its group",
        (false, _) => "others",
        (true, true) => "its group and others",
    };
    Some(format!("is writable by {who} (mode {:04o}); make it writable by its owner only (chmod go-w)", mode & 0o7777))
}

/// Logs and builds the refusal of a state file.
fn refuse(path: &Path, reason: String) -> StoreError {
    tracing::warn!(path = %path.display(), reason = %reason, "refusing a state file");
    StoreError::Corrupt { path: PathBuf::from(path), reason: format!("{reason}: refused") }
}

/// An entry's type, for messages.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn only_a_private_state_dir_under_safe_parents_is_trusted() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let state = tmp.path().join("state");
        std::fs::create_dir(&state).unwrap_or_else(|e| panic!("{e}"));
        chmod(&state, 0o700);
        assert!(check_dir(&state).is_ok(), "{:?}", check_dir(&state));
        // The state dir writable by others, then by its group.
        for mode in [0o777, 0o770, 0o1777] {
            chmod(&state, mode);
            let err = check_dir(&state).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(&state.display().to_string()) && err.contains("writable by"), "{mode:o}: {err}");
        }
        chmod(&state, 0o700);
        // A parent writable by its group.
        chmod(tmp.path(), 0o770);
        let err = check_dir(&state).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains(&format!("{}: {} is writable by its group", state.display(), tmp.path().display())),
            "{err}"
        );
        // A sticky parent writable by all is safe when root owns it (as /tmp), not otherwise.
        chmod(tmp.path(), 0o1777);
        assert_eq!(check_dir(&state).is_ok(), nix::unistd::geteuid().is_root());
        chmod(tmp.path(), 0o700);
        // Through a symbolic link: the link's directory is checked too.
        let links = tmp.path().join("links");
        std::fs::create_dir(&links).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&state, links.join("state")).unwrap_or_else(|e| panic!("{e}"));
        assert!(check_dir(&links.join("state")).is_ok());
        chmod(&links, 0o777);
        let err = check_dir(&links.join("state")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(&format!("{} is writable", links.display())), "{err}");
    }

    #[test]
    fn records_are_read_only_from_regular_files_within_the_cap() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = tmp.path().join("a.key");
        std::fs::write(&file, b"12345").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&file, 5).ok().flatten().as_deref(), Some(&b"12345"[..]));
        assert!(read(&file, 4).is_err_and(|e| e.to_string().contains("more than the 4")));
        assert!(matches!(read(&tmp.path().join("none.key"), 5), Ok(None)));
        let link = tmp.path().join("link.key");
        std::os::unix::fs::symlink(&file, &link).unwrap_or_else(|e| panic!("{e}"));
        assert!(read(&link, 5).is_err_and(|e| e.to_string().contains("symbolic link")));
        let fifo = tmp.path().join("fifo.key");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap_or_else(|e| panic!("{e}"));
        // No writer: a blocking open would wait forever.
        assert!(read(&fifo, 5).is_err_and(|e| e.to_string().contains("FIFO")));
        assert!(read(tmp.path(), 5).is_err_and(|e| e.to_string().contains("directory")));
    }

    #[test]
    fn sweep_removes_temp_files_and_reports_what_it_leaves() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path();
        std::fs::write(dir.join(".tmp-a.key-1-1"), b"junk").unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(dir.join(".tmp-planted")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("good.key"), b"{}").unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(dir.join("good.key"), dir.join("link.key")).unwrap_or_else(|e| panic!("{e}"));
        nix::unistd::mkfifo(&dir.join("fifo.key"), nix::sys::stat::Mode::S_IRWXU).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sweep(dir, ".key").ok(), Some(Swept { removed: 1, ignored: 3 }));
        assert!(!dir.join(".tmp-a.key-1-1").exists());
        assert!(dir.join(".tmp-planted").is_dir() && dir.join("good.key").is_file());
    }
}
