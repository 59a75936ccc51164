//! Argument parsing, rendering and exit-status tests (no daemon needed).

use std::path::Path;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use super::error::CliError;
use super::key::{KeyCommand, KeyListReport, KeyReport, PublicFormat};
use super::output::{latency, render, rfc3339, uptime};
use super::sign::VerifyReport;
use super::*;
use tpm_vault_client::{Error, HashAlgorithm, KeyAlgorithm, KeyInfo, KeyUsage, PcrBinding, SignatureScheme};

fn parse(args: &[&str]) -> Cli {
    match Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())) {
        Ok(cli) => cli,
        Err(e) => panic!("{args:?}: {e}"),
    }
}

fn parse_err(args: &[&str]) -> clap::Error {
    match Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())) {
        Ok(cli) => panic!("{args:?} parsed: {cli:?}"),
        Err(e) => e,
    }
}

#[test]
fn command_definition_is_valid() {
    Cli::command().debug_assert();
}

#[test]
fn socket_defaults_and_env() {
    let cli = parse(&["status"]);
    let expected = std::env::var_os("TPM_VAULT_SOCKET").unwrap_or_else(|| DEFAULT_SOCKET.into());
    assert_eq!(cli.global.socket, Path::new(&expected));
    assert_eq!(cli.global.output, OutputFormat::Text);
    assert!(matches!(cli.command, Command::Status(_)));
    let command = Cli::command();
    let socket = command.get_arguments().find(|a| a.get_id() == "socket").unwrap();
    assert_eq!(socket.get_env(), Some(std::ffi::OsStr::new("TPM_VAULT_SOCKET")));
}

#[test]
fn globals_go_before_or_after_the_command() {
    for args in [
        &["--socket", "/tmp/v.sock", "--output", "json", "key", "list"][..],
        &["key", "list", "--socket", "/tmp/v.sock", "--output", "json"][..],
        &["key", "--output=json", "list", "--socket=/tmp/v.sock"][..],
    ] {
        let cli = parse(args);
        assert_eq!(cli.global.socket, Path::new("/tmp/v.sock"), "{args:?}");
        assert_eq!(cli.global.output, OutputFormat::Json, "{args:?}");
        assert!(matches!(cli.command, Command::Key(KeyCommand::List(_))));
    }
    let err = parse_err(&["--output", "yaml", "status"]);
    assert_eq!(err.kind(), ErrorKind::InvalidValue);
}

#[test]
fn key_create() {
    let cli = parse(&["key", "create", "web"]);
    let Command::Key(KeyCommand::Create(args)) = cli.command else {
        panic!("not key create");
    };
    assert_eq!(args.name, "web");
    assert_eq!(args.alg, KeyAlgorithm::EccP256);
    assert_eq!(args.pcr, None);

    let cli = parse(&["key", "create", "disk", "--alg", "rsa-3072", "--pcr", "sha256:9,10"]);
    let Command::Key(KeyCommand::Create(args)) = cli.command else {
        panic!("not key create");
    };
    assert_eq!(args.alg, KeyAlgorithm::Rsa3072);
    assert_eq!(args.pcr, Some(PcrBinding::current("sha256", [9, 10]).unwrap()));

    let value = "ab".repeat(32);
    let cli = parse(&["key", "create", "disk", "--pcr", &format!("sha256:9={value}")]);
    let Command::Key(KeyCommand::Create(args)) = cli.command else {
        panic!("not key create");
    };
    assert_eq!(args.pcr, Some(PcrBinding::expected("sha256", [(9, vec![0xab; 32])]).unwrap()));
}

#[test]
fn key_create_rejects_bad_values() {
    let err = parse_err(&["key", "create", "web", "--alg", "ecc-p521"]);
    assert_eq!(err.kind(), ErrorKind::InvalidValue);
    assert!(err.to_string().contains("ecc-p384"), "{err}");

    let err = parse_err(&["key", "create", "web", "--pcr", "sha256:24"]);
    assert_eq!(err.kind(), ErrorKind::ValueValidation);
    assert!(err.to_string().contains("PCR index 24 is out of range (0-23)"), "{err}");

    let err = parse_err(&["key", "create"]);
    assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
}

#[test]
fn key_show_public_delete() {
    let cli = parse(&["key", "show", "web"]);
    assert!(matches!(cli.command, Command::Key(KeyCommand::Show(a)) if a.name == "web"));

    let cli = parse(&["key", "public", "web"]);
    assert!(matches!(
        cli.command,
        Command::Key(KeyCommand::Public(a)) if a.format == PublicFormat::Pem
    ));
    let cli = parse(&["key", "public", "web", "--format", "der"]);
    assert!(matches!(
        cli.command,
        Command::Key(KeyCommand::Public(a)) if a.format == PublicFormat::Der
    ));
    assert_eq!(parse_err(&["key", "public", "web", "--format", "jwk"]).kind(), ErrorKind::InvalidValue);

    let cli = parse(&["key", "delete", "web"]);
    assert!(matches!(cli.command, Command::Key(KeyCommand::Delete(a)) if a.name == "web"));
}

#[test]
fn sign_args() {
    let cli = parse(&["sign", "web", "--in", "msg.bin", "--out", "msg.sig"]);
    let Command::Sign(args) = cli.command else {
        panic!("not sign");
    };
    assert_eq!(args.input.name, "web");
    assert_eq!(args.input.input, Path::new("msg.bin"));
    assert_eq!(args.out, Path::new("msg.sig"));
    assert!(!args.input.digest);
    assert_eq!(args.input.hash, None);
    assert_eq!(args.input.scheme, None);

    let cli = parse(&["sign", "web", "--in", "-", "--digest", "--hash", "sha384", "--scheme", "pss", "--out", "-"]);
    let Command::Sign(args) = cli.command else {
        panic!("not sign");
    };
    assert_eq!(args.input.input, Path::new("-"));
    assert!(args.input.digest);
    assert_eq!(args.input.hash, Some(HashAlgorithm::Sha384));
    assert_eq!(args.input.scheme, Some(SignatureScheme::RsaPss));

    for scheme in ["ecdsa", "pkcs1"] {
        parse(&["sign", "k", "--in", "f", "--out", "s", "--scheme", scheme]);
    }
    assert_eq!(parse_err(&["sign", "web", "--in", "msg.bin"]).kind(), ErrorKind::MissingRequiredArgument);
    assert_eq!(
        parse_err(&["sign", "web", "--in", "m", "--out", "s", "--hash", "sha1"]).kind(),
        ErrorKind::InvalidValue
    );
    assert_eq!(
        parse_err(&["sign", "web", "--in", "m", "--out", "s", "--scheme", "rsa"]).kind(),
        ErrorKind::InvalidValue
    );
}

#[test]
fn verify_args() {
    let cli = parse(&["verify", "web", "--in", "msg.bin", "--sig", "msg.sig", "--hash", "sha256"]);
    let Command::Verify(args) = cli.command else {
        panic!("not verify");
    };
    assert_eq!(args.input.name, "web");
    assert_eq!(args.sig, Path::new("msg.sig"));
    assert_eq!(args.input.hash, Some(HashAlgorithm::Sha256));
    assert_eq!(parse_err(&["verify", "web", "--in", "msg.bin"]).kind(), ErrorKind::MissingRequiredArgument);
}

#[test]
fn completions_args_and_script() {
    let cli = parse(&["completions", "bash"]);
    assert!(matches!(cli.command, Command::Completions(_)));
    assert_eq!(parse_err(&["completions", "tcsh"]).kind(), ErrorKind::InvalidValue);
    let mut script = Vec::new();
    clap_complete::generate(clap_complete::Shell::Bash, &mut Cli::command(), "tpm-vault", &mut script);
    let script = String::from_utf8(script).unwrap();
    assert!(script.contains("ecc-p384"));
}

#[test]
fn no_command_shows_help_and_later_commands_do_not_exist() {
    let err = parse_err(&[]);
    assert_eq!(err.kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
    assert_eq!(parse_err(&["fly", "x"]).kind(), ErrorKind::InvalidSubcommand);
}

#[test]
fn help_lists_exit_statuses() {
    let help = Cli::command().render_long_help().to_string();
    assert!(help.contains("Exit status:"), "{help}");
    assert!(help.contains("3  no such key"), "{help}");
    for command in ["status", "key", "sign", "verify", "completions"] {
        assert!(help.contains(command), "{command} missing from help");
    }
}

#[test]
fn exit_codes_follow_grpc_codes() {
    let code = |status: tonic::Status| CliError::from(Error::from(status)).exit_code();
    assert_eq!(code(tonic::Status::invalid_argument("bad name")), 2);
    assert_eq!(code(tonic::Status::not_found("no such key")), 3);
    assert_eq!(code(tonic::Status::already_exists("taken")), 4);
    assert_eq!(code(tonic::Status::permission_denied("no")), 5);
    assert_eq!(code(tonic::Status::failed_precondition("pcr")), 6);
    assert_eq!(code(tonic::Status::unavailable("tpm down")), 7);
    assert_eq!(code(tonic::Status::resource_exhausted("busy")), 8);
    assert_eq!(code(tonic::Status::internal("oops")), 1);
    assert_eq!(CliError::VerificationFailed.exit_code(), 1);
    assert_eq!(CliError::from(Error::InvalidInput("x".into())).exit_code(), 2);
}

#[tokio::test]
async fn missing_daemon_is_exit_7_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vault.sock");
    let cli = parse(&["--socket", socket.to_str().unwrap(), "key", "list"]);
    let mut ctx = Context { socket: cli.global.socket, output: cli.global.output, client: None };
    let err = cli.command.run(&mut ctx).await.unwrap_err();
    assert_eq!(err.exit_code(), 7);
    let message = err.to_string();
    assert!(!message.contains('\n'));
    assert!(message.ends_with("No such file or directory (is tpm-vaultd running?)"), "{message}");
}

#[tokio::test]
async fn missing_input_file_is_reported_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("absent.bin");
    let cli =
        parse(&["--socket", "/nonexistent/vault.sock", "sign", "web", "--in", input.to_str().unwrap(), "--out", "-"]);
    let mut ctx = Context { socket: cli.global.socket, output: cli.global.output, client: None };
    let err = cli.command.run(&mut ctx).await.unwrap_err();
    assert_eq!(err.to_string(), format!("cannot read {}: No such file or directory", input.display()));
    assert_eq!(err.exit_code(), 1);
}

#[tokio::test]
async fn oversized_digest_file_is_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.bin");
    std::fs::write(&input, [0u8; 100]).unwrap();
    let cli = parse(&[
        "--socket",
        "/nonexistent/vault.sock",
        "sign",
        "web",
        "--digest",
        "--in",
        input.to_str().unwrap(),
        "--out",
        "-",
    ]);
    let mut ctx = Context { socket: cli.global.socket, output: cli.global.output, client: None };
    let err = cli.command.run(&mut ctx).await.unwrap_err();
    assert!(err.to_string().contains("too large for a digest"), "{err}");
    assert_eq!(err.exit_code(), 2);
}

fn sample_key() -> KeyInfo {
    KeyInfo {
        name: "web".into(),
        algorithm: KeyAlgorithm::EccP256,
        tpm_name: "000bdead".into(),
        created_unix: 1_764_481_740,
        pcr_binding: Some(PcrBinding::current("sha256", [9]).unwrap()),
        owner_uid: 1000,
        has_auth: false,
        usages: vec![KeyUsage::Sign, KeyUsage::Ssh],
    }
}

fn rendered(format: OutputFormat, report: &dyn Report) -> String {
    let mut out = Vec::new();
    render(format, report, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn key_text_and_json() {
    let text = rendered(OutputFormat::Text, &KeyReport(sample_key()));
    assert!(text.contains("name:        web\n"), "{text}");
    assert!(text.contains("created:     2025-11-30T05:49:00Z\n"), "{text}");
    assert!(text.contains("pcr binding: sha256:9 (values at creation)\n"), "{text}");
    assert!(text.contains("usages:      sign,ssh\n"), "{text}");

    let json = rendered(OutputFormat::Json, &KeyReport(sample_key()));
    assert_eq!(json.lines().count(), 1);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["name"], "web");
    assert_eq!(value["algorithm"], "ecc-p256");
    assert_eq!(value["pcr_binding"]["pcrs"][0], 9);
    assert_eq!(value["has_auth"], false);
    assert_eq!(value["usages"], serde_json::json!(["sign", "ssh"]));
}

#[test]
fn key_list_text_and_json() {
    let report = KeyListReport(vec![sample_key()]);
    let text = rendered(OutputFormat::Text, &report);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("NAME  ALGORITHM  CREATED               PCRS      PASSWORD  USAGES"));
    assert_eq!(lines.next(), Some("web   ecc-p256   2025-11-30T05:49:00Z  sha256:9  no        sign,ssh"));
    assert_eq!(rendered(OutputFormat::Text, &KeyListReport(vec![])), "");
    let value: serde_json::Value = serde_json::from_str(&rendered(OutputFormat::Json, &KeyListReport(vec![]))).unwrap();
    assert_eq!(value, serde_json::json!({ "keys": [] }));
}

#[test]
fn verify_report() {
    let ok = VerifyReport { name: "web".into(), valid: true };
    assert_eq!(rendered(OutputFormat::Text, &ok), "Verified OK\n");
    assert_eq!(rendered(OutputFormat::Json, &ok), "{\"name\":\"web\",\"valid\":true}\n");
}

#[test]
fn time_formats() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    assert_eq!(uptime(Duration::from_secs(0)), "0s");
    assert_eq!(uptime(Duration::from_secs(3 * 86_400 + 5)), "3d 0h 0m 5s");
    assert_eq!(uptime(Duration::from_secs(61)), "1m 1s");
    assert_eq!(latency(Duration::from_micros(750)), "750us");
    assert_eq!(latency(Duration::from_micros(1250)), "1.2ms");
    assert_eq!(latency(Duration::from_millis(2500)), "2.50s");
}
