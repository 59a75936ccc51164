//! Interoperability: a secret sealed for the vault's TPM by tpm2-pytss (Debian's
//! `python3-tpm2-pytss`), an implementation of TPM 2.0 duplication no one here wrote. Python
//! makes the sealed object (a KEYEDHASH sealed-data object whose authPolicy is a PolicyPCR
//! digest Python computes, the secret as its sensitive data), wraps it with `utils.wrap` for the
//! SRK public `tpm-vault srk public` printed, and writes the raw triple (public, duplicate,
//! encrypted seed); `seal import --public/--duplicate/--seed` imports it and `unseal` opens it.
//! An altered duplicate is refused and stores nothing.
//!
//! The test needs `/usr/bin/python3` with `tpm2_pytss` (scripts/test installs the package):
//! without it, it fails and says so; it never passes without having run tpm2-pytss.

mod support;

use std::path::Path;
use std::process::Command;

use support::{fails, ok, Daemon, DaemonCli as _};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

/// The fleet side, in tpm2-pytss: argv = SRK TPM2B_PUBLIC file, PCR 9 value (hex), secret file,
/// output prefix. Writes PREFIX.pub (TPM2B_PUBLIC), PREFIX.dup (TPM2B_PRIVATE) and PREFIX.seed
/// (TPM2B_ENCRYPTED_SECRET).
const SCRIPT: &str = r#"
import hashlib, sys
from tpm2_pytss.constants import TPM2_ALG, TPM2_CC, TPMA_OBJECT
from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE, TPML_PCR_SELECTION
from tpm2_pytss.utils import wrap

srk_file, pcr9, secret_file, prefix = sys.argv[1:5]
srk, _ = TPM2B_PUBLIC.unmarshal(open(srk_file, "rb").read())
secret = open(secret_file, "rb").read()

# PolicyPCR(sha256:9 = pcr9) from a zero digest (TPM 2.0 Part 3, TPM2_PolicyPCR).
selection = TPML_PCR_SELECTION.parse("sha256:9").marshal()
pcr_digest = hashlib.sha256(bytes.fromhex(pcr9)).digest()
policy = hashlib.sha256(
    bytes(32) + int(TPM2_CC.PolicyPCR).to_bytes(4, "big") + selection + pcr_digest
).digest()

# A sealed-data object only the policy opens (no userWithAuth), not bound to a TPM or parent.
sensitive, public = TPM2B_SENSITIVE.keyedhash_from_secret(
    secret, objectAttributes=TPMA_OBJECT.ADMINWITHPOLICY | TPMA_OBJECT.NODA
)
public.publicArea.authPolicy = policy
# Outer wrapper only (symdef None): the vault's raw import takes no inner-wrapper key.
_, duplicate, seed = wrap(srk.publicArea, public, sensitive)

open(prefix + ".pub", "wb").write(public.marshal())
open(prefix + ".dup", "wb").write(duplicate.marshal())
open(prefix + ".seed", "wb").write(seed.marshal())
print(policy.hex())
"#;

/// Runs [`SCRIPT`] in `dir`; returns the policy digest it computed (hex).
fn pytss_wrap(dir: &Path, srk: &str, pcr9: &str, secret: &str, prefix: &str) -> String {
    std::fs::write(dir.join("wrap.py"), SCRIPT).unwrap();
    let out = Command::new("/usr/bin/python3")
        .close_inherited_fds()
        .current_dir(dir)
        .args(["wrap.py", srk, pcr9, secret, prefix])
        .output()
        .unwrap_or_else(|e| panic!("/usr/bin/python3: {e} (install python3-tpm2-pytss)"));
    assert!(
        out.status.success(),
        "tpm2-pytss wrap failed (is python3-tpm2-pytss installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_secret_wrapped_by_tpm2_pytss_imports_and_unseals() {
    let d = Daemon::start();
    let dir = d.dir.path();
    d.extend_pcr(9, b"kernel-1");
    let pcrs: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["pcr", "read", "--pcrs", "sha256:9", "--output", "json"]))).unwrap();
    let pcr9 = pcrs["pcrs"][0]["value"].as_str().unwrap().to_owned();
    ok(d.cli(&["srk", "public", "--format", "tpm2b", "--out", "srk.pub"]));
    let secret = b"wrapped by tpm2-pytss \x00\xff";
    std::fs::write(dir.join("secret"), secret).unwrap();

    let policy = pytss_wrap(dir, "srk.pub", &pcr9, "secret", "py");
    let import = |name: &str, prefix: &str| {
        let (public, duplicate, seed) = (format!("{prefix}.pub"), format!("{prefix}.dup"), format!("{prefix}.seed"));
        let pcr = format!("sha256:9={pcr9}");
        d.cli(&["seal", "import", name, "--public", &public, "--duplicate", &duplicate, "--seed", &seed, "--pcr", &pcr])
    };
    let out = String::from_utf8(ok(import("from-pytss", "py"))).unwrap();
    assert!(out.contains(&format!("policy digest {policy}")), "the vault's policy digest is Python's: {out}");
    assert_eq!(ok(d.cli(&["unseal", "from-pytss"])), secret);

    // An altered duplicate: the TPM's integrity check refuses it; nothing is stored.
    let mut dup = std::fs::read(dir.join("py.dup")).unwrap();
    let last = dup.len() - 1;
    dup[last] ^= 1;
    for ext in ["pub", "seed"] {
        std::fs::copy(dir.join(format!("py.{ext}")), dir.join(format!("bad.{ext}"))).unwrap();
    }
    std::fs::write(dir.join("bad.dup"), dup).unwrap();
    let line = fails(&import("altered", "bad"), 2);
    assert!(line.contains("altered"), "{line}");
    fails(&d.cli(&["unseal", "altered"]), 3);

    // PCR 9 moves: the imported secret no longer opens.
    d.extend_pcr(9, b"evil");
    fails(&d.cli(&["unseal", "from-pytss"]), 6);
}
