//! `tpm-model`: runs the TPM device model in front of a running swtpm, for scripts and
//! programs in other languages.
//!
//! ```text
//! tpm-model --upstream PORT [--profile orin-ftpm|dtpm-slb9670|none] [--speed F] [--spaces N]
//! ```
//! Prints one JSON line `{"stats_port": S, "spaces": [{"id", "port", "tcti"}, ...]}` once it
//! listens, then runs until killed. More spaces, their figures and closing them: the stats
//! port (`echo stats | nc 127.0.0.1 S`; see the library's `server` module).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use tpm_vault_tpm_model::{ModelBuilder, Profile};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpm-model: {e}");
            ExitCode::from(64)
        }
    }
}

fn run() -> Result<(), String> {
    let mut upstream = None;
    let mut profile = Profile::orin_ftpm();
    let mut speed = 1.0;
    let mut spaces = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--upstream" => upstream = Some(value()?.parse::<u16>().map_err(|e| format!("--upstream: {e}"))?),
            "--profile" => {
                let v = value()?;
                profile = Profile::named(&v)
                    .ok_or_else(|| format!("unknown profile {v:?} (known: {})", Profile::NAMES.join(", ")))?;
            }
            "--speed" => speed = value()?.parse::<f64>().map_err(|e| format!("--speed: {e}"))?,
            "--spaces" => spaces = value()?.parse::<usize>().map_err(|e| format!("--spaces: {e}"))?,
            "-h" | "--help" => {
                println!(
                    "usage: tpm-model --upstream SWTPM_PORT [--profile {}] [--speed FACTOR] [--spaces N]",
                    Profile::NAMES.join("|")
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let upstream = upstream.ok_or("--upstream SWTPM_PORT is required")?;
    let model =
        ModelBuilder::new(upstream).with_profile(profile).with_speed(speed).build().map_err(|e| e.to_string())?;
    let mut endpoints = Vec::new();
    for _ in 0..spaces {
        endpoints.push(model.open().map_err(|e| e.to_string())?);
    }
    let listed: Vec<_> =
        endpoints.iter().map(|e| serde_json::json!({ "id": e.id(), "port": e.port(), "tcti": e.tcti() })).collect();
    println!("{}", serde_json::json!({ "stats_port": model.stats_port(), "spaces": listed }));
    loop {
        std::thread::park();
    }
}
