//! The man pages shipped in the Debian package (`docs/man/`) are what the clap definitions of
//! `tpm-vault` and `tpm-vaultd` render today (`examples/man.rs`).

#[allow(dead_code)]
#[path = "../examples/man.rs"]
mod man;

#[test]
fn committed_man_pages_are_current() {
    let pages = man::render().unwrap();
    assert!(pages.contains_key("tpm-vault.1") && pages.contains_key("tpm-vaultd.1"), "{:?}", pages.keys());
    assert!(pages.contains_key("tpm-vault-key-create.1"), "one page per subcommand");
    let dir = man::committed_dir();
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".1"))
        .collect();
    committed.sort();
    let stale = "docs/man is stale: run `cargo run -p tpm-vault-cli --example man` and commit docs/man";
    assert_eq!(committed, pages.keys().cloned().collect::<Vec<_>>(), "{stale}");
    for (name, text) in &pages {
        assert!(std::fs::read(dir.join(name)).unwrap() == *text, "{name} differs; {stale}");
    }
    // The exit statuses (after_help) are in the page.
    let main = String::from_utf8_lossy(&pages["tpm-vault.1"]);
    assert!(main.contains("wrong key password"), "exit statuses missing");
}
