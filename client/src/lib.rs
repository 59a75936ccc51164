//! tpm-vault client
