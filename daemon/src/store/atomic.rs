//! Crash-safe file writes: temp file in the same directory, write, fsync, then rename (replace)
//! or hard-link (create, refusing to overwrite), then fsync the directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of in-flight temp files; a file with it is garbage after a crash (`trust::sweep`
/// removes them at start).
pub const TEMP_PREFIX: &str = ".tmp-";

/// How the final file is put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Atomically replace any existing file.
    Replace,
    /// Fail with `AlreadyExists` if the file exists.
    NoClobber,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `data` to `dir/file` atomically and durably (file mode 0600).
///
/// # Errors
/// The underlying I/O error; `AlreadyExists` for [`Mode::NoClobber`] when the file exists.
/// On error the destination is untouched and the temp file removed.
pub fn write(dir: &Path, file: &str, data: &[u8], mode: Mode) -> io::Result<()> {
    let tmp =
        dir.join(format!("{TEMP_PREFIX}{file}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let dest = dir.join(file);
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        match mode {
            Mode::Replace => fs::rename(&tmp, &dest),
            Mode::NoClobber => {
                let linked = fs::hard_link(&tmp, &dest);
                fs::remove_file(&tmp)?;
                linked
            }
        }
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    sync_dir(dir)
}

/// fsyncs a directory so a rename, link or unlink in it survives a power cut.
///
/// # Errors
/// The underlying I/O error.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates a directory (and parents) with mode 0700 if it does not exist.
///
/// # Errors
/// The underlying I/O error.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_clobber_refuses_and_replace_overwrites() {
        let dir = std::env::temp_dir().join(format!("tv-atomic-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        create_private_dir(&dir).ok();
        assert!(write(&dir, "a", b"one", Mode::NoClobber).is_ok());
        let err = write(&dir, "a", b"two", Mode::NoClobber).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::AlreadyExists));
        assert_eq!(fs::read(dir.join("a")).ok().as_deref(), Some(&b"one"[..]));
        assert!(write(&dir, "a", b"three", Mode::Replace).is_ok());
        assert_eq!(fs::read(dir.join("a")).ok().as_deref(), Some(&b"three"[..]));
        let _ = fs::remove_dir_all(&dir);
    }
}
