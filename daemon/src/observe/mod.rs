//! Observability: counters, the Prometheus endpoint and the log writer.
//!
//! - [`metrics`]: per-RPC and per-TPM-command counters and latency histograms;
//! - [`telemetry`]: the optional Prometheus endpoint that renders them;
//! - [`process_metrics`]: the `process_*` figures read from procfs at each scrape;
//! - [`logwriter`]: log and audit lines to their destination in batches, off the request path.
//!
//! The audit events themselves are built by [`crate::auth::audit`].

pub mod logwriter;
pub mod metrics;
pub mod process_metrics;
pub mod telemetry;
