//! Reading and writing the files named on the command line, `-` meaning stdin/stdout.
//!
//! Owns the `-` convention, the size limits on inputs, and streaming large messages through a
//! hash. It does not print results (that is `output`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use tpm_vault_client::{natural_hash, signs_whole_messages};
use tpm_vault_client::{Error, HashAlgorithm, KeyAlgorithm, SignInput, SignatureScheme};
use tpm_vault_client::{Hasher, INLINE_MESSAGE_LIMIT, MAX_WHOLE_MESSAGE};

use super::error::CliError;
use super::Context;

/// A digest file larger than this is surely a message given with `--digest` by mistake.
const MAX_DIGEST_FILE: usize = 64;

/// A signature file larger than this is not a signature (RSA-3072 signatures are 384 bytes).
const MAX_SIGNATURE_FILE: usize = 64 * 1024;

/// True for the path `-`.
pub(crate) fn is_std(path: &Path) -> bool {
    path == Path::new("-")
}

/// Opens `path` for reading; `-` is stdin.
pub(crate) fn open(path: &Path) -> Result<Box<dyn Read>, CliError> {
    if is_std(path) {
        Ok(Box::new(io::stdin().lock()))
    } else {
        let file = File::open(path).map_err(CliError::read(path))?;
        Ok(Box::new(file))
    }
}

/// Reads all of `path` (`-` = stdin), refusing more than `limit` bytes.
pub(crate) fn read_limited(path: &Path, limit: usize, what: &str) -> Result<Vec<u8>, CliError> {
    let mut buf = Vec::new();
    open(path)?.take(limit as u64 + 1).read_to_end(&mut buf).map_err(CliError::read(path))?;
    if buf.len() > limit {
        return Err(Error::InvalidInput(format!(
            "{} is too large for {what} (more than {limit} bytes)",
            display(path)
        ))
        .into());
    }
    Ok(buf)
}

/// Reads a signature file.
pub(crate) fn read_signature(path: &Path) -> Result<Vec<u8>, CliError> {
    read_limited(path, MAX_SIGNATURE_FILE, "a signature")
}

/// Reads what `sign`/`verify` work on: a digest (`--digest`) or a message.
///
/// Reading comes before connecting, so a missing file is reported as such. A message larger
/// than the client sends whole is hashed while it is read, so inputs of any size work in
/// bounded memory; the hash is then resolved first (the key's natural hash if unspecified,
/// which needs the daemon) and returned, since it must go with the digest. ML-DSA and hybrid
/// keys sign whole messages, so theirs are read whole, up to the daemon's 4 MiB limit.
pub(crate) async fn read_sign_input(
    ctx: &mut Context,
    key: &str,
    path: &Path,
    digest: bool,
    hash: HashAlgorithm,
    scheme: SignatureScheme,
) -> Result<(SignInput, HashAlgorithm), CliError> {
    if digest {
        let bytes = read_limited(path, MAX_DIGEST_FILE, "a digest")?;
        return Ok((SignInput::Digest(bytes), hash));
    }
    let mut reader = open(path)?;
    let mut head = Vec::new();
    (&mut reader).take(INLINE_MESSAGE_LIMIT as u64 + 1).read_to_end(&mut head).map_err(CliError::read(path))?;
    if head.len() <= INLINE_MESSAGE_LIMIT {
        return Ok((SignInput::Message(head), hash));
    }
    let algorithm = if signs_whole_messages(KeyAlgorithm::Unspecified, scheme) {
        KeyAlgorithm::Unspecified
    } else {
        ctx.client().await?.key(key).await?.algorithm
    };
    if signs_whole_messages(algorithm, scheme) {
        let more = (MAX_WHOLE_MESSAGE - head.len()) as u64 + 1;
        (&mut reader).take(more).read_to_end(&mut head).map_err(CliError::read(path))?;
        if head.len() > MAX_WHOLE_MESSAGE {
            return Err(Error::InvalidInput(format!(
                "{} is larger than {MAX_WHOLE_MESSAGE} bytes: ML-DSA and hybrid keys sign whole messages; sign a \
                 manifest holding the file's SHA-256 instead",
                display(path)
            ))
            .into());
        }
        return Ok((SignInput::Message(head), hash));
    }
    let hash = if hash == HashAlgorithm::Unspecified { natural_hash(algorithm) } else { hash };
    let mut hasher = Hasher::new(hash)?;
    hasher.update(&head);
    drop(head);
    io::copy(&mut reader, &mut hasher).map_err(CliError::read(path))?;
    Ok((SignInput::Digest(hasher.finish()), hash))
}

/// Writes `bytes` to `path` (`-` = stdout), replacing the file.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    if is_std(path) {
        write_stdout(bytes)
    } else {
        std::fs::write(path, bytes).map_err(CliError::write(path))
    }
}

/// Writes a secret (an unsealed secret, an activated credential) to `path` (`-` = stdout):
/// into a new file next to it that only its owner can read (mode 0600), synced, then renamed
/// over `path` and the directory synced. So the secret is never readable by other users, even
/// when `path` existed with a wider mode, and a crash leaves the old file or the whole new one.
/// A `path` that exists and is not a regular file (a FIFO, `/dev/fd/N`) is written in place,
/// a FIFO only when the caller owns it: one made by another user (in `/tmp`, say) would hand
/// them the secret.
pub(crate) fn write_secret(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
    if is_std(path) {
        return write_stdout(bytes);
    }
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut f = std::fs::OpenOptions::new().write(true).open(path).map_err(CliError::write(path))?;
        // Checked on what was opened, so a FIFO swapped in after the look above is caught too.
        let meta = f.metadata().map_err(CliError::write(path))?;
        let me = nix::unistd::geteuid().as_raw();
        if meta.file_type().is_fifo() && meta.uid() != me {
            let why = format!(
                "a FIFO owned by uid {}, not by you (uid {me}): another user could read the secret",
                meta.uid()
            );
            return Err(CliError::write(path)(io::Error::new(io::ErrorKind::PermissionDenied, why)));
        }
        return f.write_all(bytes).and_then(|()| f.flush()).map_err(CliError::write(path));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(CliError::write(path))
}

/// Writes `bytes` to stdout and flushes.
pub(crate) fn write_stdout(bytes: &[u8]) -> Result<(), CliError> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush()).map_err(CliError::stdout)
}

/// How a path is named in messages.
fn display(path: &Path) -> String {
    if is_std(path) {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn secrets_are_written_owner_only_and_replace_the_file_whole() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("secret.bin");
        std::fs::write(&path, b"an older, longer secret").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap_or_else(|e| panic!("{e}"));
        write_secret(&path, b"hunter2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(std::fs::read(&path).unwrap_or_default(), b"hunter2");
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
        assert_eq!(mode, 0o600);
        let left: Vec<_> =
            std::fs::read_dir(dir.path()).into_iter().flatten().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
        // A directory that does not exist is a clear error, not a panic.
        assert!(write_secret(&dir.path().join("no/such/dir/x"), b"x").is_err());
    }

    /// A FIFO the caller made gets the secret; one another user made does not (run as root:
    /// the FIFO is given to uid 65534, and the reader never sees a byte).
    #[test]
    fn secrets_go_only_into_fifos_the_caller_owns() {
        use nix::sys::stat::Mode;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mine = dir.path().join("mine.fifo");
        nix::unistd::mkfifo(&mine, Mode::S_IRUSR | Mode::S_IWUSR).unwrap_or_else(|e| panic!("{e}"));
        let reader = {
            let mine = mine.clone();
            std::thread::spawn(move || std::fs::read(mine).unwrap_or_default())
        };
        write_secret(&mine, b"for me").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reader.join().unwrap_or_default(), b"for me");

        if !nix::unistd::geteuid().is_root() {
            return; // cannot make a FIFO owned by someone else
        }
        let theirs = dir.path().join("theirs.fifo");
        nix::unistd::mkfifo(&theirs, Mode::from_bits_truncate(0o666)).unwrap_or_else(|e| panic!("{e}"));
        nix::unistd::chown(&theirs, Some(65534.into()), None).unwrap_or_else(|e| panic!("{e}"));
        let reader = {
            let theirs = theirs.clone();
            std::thread::spawn(move || std::fs::read(theirs).unwrap_or_default())
        };
        let err =
            write_secret(&theirs, b"not for them").map(|()| "written".to_owned()).unwrap_or_else(|e| e.to_string());
        assert!(err.contains("a FIFO owned by uid 65534, not by you"), "{err}");
        assert_eq!(reader.join().unwrap_or_default(), b"", "the other user's reader got nothing");
    }
}
