//! The peer a shell script would use: tpm2-tools, one `tpm2_sign` process per signature on the
//! same swtpm (`TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=P`).
//!
//! Raw swtpm has no resource manager and 3 object slots, and a tpm2-tools process leaves what
//! it loaded in the TPM when it exits, so `tpm2_sign -c key.ctx` in a bare loop fails with
//! 0x902 (object memory) on the fourth call. A working script therefore flushes after each
//! signature; two such scripts are measured (see [`Variant`]). Setup, not timed: create the
//! SRK with `tpm2_createprimary`, `tpm2_load` the raw phase's key blobs once to save `key.ctx`,
//! and flush.
//!
//! The SRK needs care: tpm2-tools 5.4 leaves `unique` empty unless given `-u`, which derives a
//! different key from the TCG template (x = y = 32 zero bytes) the vault uses, and then
//! `tpm2_load` of the vault's blobs fails with 0x1df (integrity check). `-u` takes the raw
//! bytes of a `TPMU_PUBLIC_ID` C union: for ECC, `x.size` (u16, little-endian), a 128-byte
//! buffer, `y.size`, a 128-byte buffer; see [`tcg_unique`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, ensure, Context as _, Result};
use tpm_vault_daemon::formats::verify;
use tpm_vault_daemon::model::{HashAlg, KeyAlg, Scheme};

use super::{timed_loop, Pids, Timing, DIGEST};
use crate::stats::Measurement;

/// `tpm2_createprimary` deriving the TCG ECC P-256 SRK the vault uses (see the module docs).
pub const SRK_COMMAND: [&str; 13] = [
    "tpm2_createprimary",
    "-C",
    "o",
    "-g",
    "sha256",
    "-G",
    "ecc256:aes128cfb",
    "-a",
    "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|decrypt",
    "-u",
    "unique.bin",
    "-c",
    "srk.ctx",
];

/// The `-u` file that makes `tpm2_createprimary` derive the TCG SRK: a `TPMU_PUBLIC_ID` with
/// x and y each 32 zero bytes, laid out as the C struct (little-endian sizes,
/// `TPM2_MAX_ECC_KEY_BYTES` = 128-byte buffers).
pub fn tcg_unique() -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * (2 + 128));
    for _ in 0..2 {
        out.extend_from_slice(&32u16.to_le_bytes());
        out.extend_from_slice(&[0u8; 128]);
    }
    out
}

/// What one "call" of the script does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `tpm2_sign` from the saved key context, then `tpm2_flushcontext -t` (2 processes).
    SignFlush,
    /// `tpm2_load` from the key files, `tpm2_sign`, `tpm2_flushcontext -t` (3 processes): what
    /// a script holding only the key blobs (as the vault stores them) does.
    LoadSignFlush,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 2] = [Variant::SignFlush, Variant::LoadSignFlush];

    /// Short label for tables and the chart.
    pub fn label(self) -> &'static str {
        match self {
            Self::SignFlush => "tpm2_sign + flushcontext",
            Self::LoadSignFlush => "tpm2_load + tpm2_sign + flushcontext",
        }
    }

    /// The shell commands of one call, for the report.
    pub fn script(self) -> &'static [&'static str] {
        match self {
            Self::SignFlush => {
                &["tpm2_sign -c key.ctx -g sha256 -s ecdsa -d -f plain -o sig.der digest.bin", "tpm2_flushcontext -t"]
            }
            Self::LoadSignFlush => &[
                "tpm2_load -C srk.ctx -u key.pub -r key.priv -c call.ctx",
                "tpm2_sign -c call.ctx -g sha256 -s ecdsa -d -f plain -o sig.der digest.bin",
                "tpm2_flushcontext -t",
            ],
        }
    }
}

/// A directory prepared for tpm2-tools: SRK context, key blobs and context, digest.
#[derive(Debug)]
pub struct Tools {
    tcti: String,
    dir: PathBuf,
    spki: Vec<u8>,
}

/// Whether tpm2-tools is installed.
pub fn available() -> bool {
    Command::new("tpm2_sign")
        .close_inherited_fds()
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Tools {
    /// Prepares `dir` (which already holds `key.pub` and `key.priv`, see
    /// [`super::raw::write_blobs`]); `spki` is that key's public key, for checking signatures.
    ///
    /// # Errors
    /// A tool failing (its stderr is in the message).
    pub fn setup(tcti: &str, dir: &Path, spki: Vec<u8>) -> Result<Self> {
        let tools = Self { tcti: tcti.to_owned(), dir: dir.to_owned(), spki };
        std::fs::write(dir.join("digest.bin"), DIGEST).context("writing digest.bin")?;
        std::fs::write(dir.join("unique.bin"), tcg_unique()).context("writing unique.bin")?;
        tools.tool("tpm2_createprimary", &SRK_COMMAND[1..])?;
        tools.tool("tpm2_load", &["-C", "srk.ctx", "-u", "key.pub", "-r", "key.priv", "-c", "key.ctx"])?;
        tools.tool("tpm2_flushcontext", &["-t"])?;
        Ok(tools)
    }

    /// Runs one tpm2-tools command in the work directory; fails with its stderr.
    fn tool(&self, name: &str, args: &[&str]) -> Result<()> {
        let out = Command::new(name)
            .close_inherited_fds()
            .args(args.iter().map(OsStr::new))
            .current_dir(&self.dir)
            .env("TPM2TOOLS_TCTI", &self.tcti)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running {name}"))?;
        if !out.status.success() {
            bail!("{name} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    fn call(&self, variant: Variant) -> Result<()> {
        for line in variant.script() {
            let mut words = line.split_whitespace();
            let name = words.next().context("empty script line")?;
            let args: Vec<&str> = words.collect();
            self.tool(name, &args)?;
        }
        Ok(())
    }

    /// One call checked in-core, then calls in a loop.
    ///
    /// # Errors
    /// A tool failing, or a signature that does not verify.
    pub fn run(&self, variant: Variant, timing: Timing, pids: Pids) -> Result<Measurement> {
        self.call(variant)?;
        let der = std::fs::read(self.dir.join("sig.der")).context("reading sig.der")?;
        let valid = verify::verify_digest(KeyAlg::EccP256, &self.spki, Scheme::Ecdsa, HashAlg::Sha256, &DIGEST, &der)?;
        ensure!(valid, "tpm2_sign signature does not verify");
        timed_loop(timing, pids, || self.call(variant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_file_layout() {
        let u = tcg_unique();
        assert_eq!(u.len(), 260);
        assert_eq!(&u[..2], &[32, 0]);
        assert_eq!(&u[130..132], &[32, 0]);
        assert!(u[2..130].iter().chain(&u[132..]).all(|&b| b == 0));
    }
}
