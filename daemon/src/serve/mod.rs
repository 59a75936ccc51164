//! Serving: the listeners and the daemon's lifecycle around them.
//!
//! - [`app`]: the `tpm-vaultd` process: arguments, `--check-config`, logging, runtime, exit codes;
//! - [`server`]: start (simulator, vault, listeners), serve, drain and stop;
//! - [`tls`]: TPM-resident TLS keys in-process and the `--listen` gRPC-over-TLS listener;
//! - [`bounds`]: connection and message bounds that hold before authorization;
//! - [`fdlimit`]: the descriptor limit raised at start and the connection bounds fitted into it;
//! - [`systemd`]: readiness, stopping and watchdog messages to systemd.
//!
//! It does not answer RPCs (see [`crate::rpc`]) or keep counters (see [`crate::observe`]).

pub mod app;
pub mod bounds;
pub mod fdlimit;
pub mod server;
pub mod systemd;
pub mod tls;
