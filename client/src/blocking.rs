//! [`BlockingClient`]: the [`Client`] calls for synchronous code.
//!
//! Owns a private current-thread tokio runtime and drives each call to completion with
//! `block_on`, as mini-redis' blocking client does. It adds no behaviour of its own.

use std::path::Path;

use tokio::runtime::Runtime;

use crate::{
    Client, ClientBuilder, DaemonStatus, Error, KeyAlgorithm, KeyInfo, PcrBinding, PublicKey, SignInput, SignOptions,
    Signature,
};

/// A synchronous client for `tpm-vaultd`.
///
/// Do not use it from inside an async runtime: `block_on` panics there. Use [`Client`] instead.
///
/// ```no_run
/// use tpm_vault_client::BlockingClient;
///
/// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
/// for key in client.list_keys()? {
///     println!("{}", key.name);
/// }
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Debug)]
pub struct BlockingClient {
    /// The async client doing the work.
    inner: Client,
    /// Drives `inner`'s futures and its connection; lives as long as the client.
    runtime: Runtime,
}

impl BlockingClient {
    /// Connects to the daemon's Unix socket with the default timeouts.
    ///
    /// # Errors
    /// [`Error::Runtime`] if the private runtime cannot start; [`Error::Transport`] when the
    /// socket cannot be opened.
    pub fn connect(socket_path: impl AsRef<Path>) -> Result<BlockingClient, Error> {
        Self::connect_with(ClientBuilder::new(socket_path))
    }

    /// Connects with the settings of `builder`.
    pub(crate) fn connect_with(builder: ClientBuilder) -> Result<BlockingClient, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
        let inner = runtime.block_on(builder.connect())?;
        Ok(BlockingClient { inner, runtime })
    }

    /// Creates a key inside the TPM. See [`Client::create_key`].
    ///
    /// # Errors
    /// As [`Client::create_key`].
    pub fn create_key(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        pcr_binding: Option<PcrBinding>,
    ) -> Result<KeyInfo, Error> {
        self.runtime.block_on(self.inner.create_key(name, algorithm, pcr_binding))
    }

    /// A key's metadata. See [`Client::key`].
    ///
    /// # Errors
    /// As [`Client::key`].
    pub fn key(&self, name: &str) -> Result<KeyInfo, Error> {
        self.runtime.block_on(self.inner.key(name))
    }

    /// All keys the caller may see. See [`Client::list_keys`].
    ///
    /// # Errors
    /// As [`Client::list_keys`].
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, Error> {
        self.runtime.block_on(self.inner.list_keys())
    }

    /// Deletes a key. See [`Client::delete_key`].
    ///
    /// # Errors
    /// As [`Client::delete_key`].
    pub fn delete_key(&self, name: &str) -> Result<(), Error> {
        self.runtime.block_on(self.inner.delete_key(name))
    }

    /// A key's public part. See [`Client::public_key`].
    ///
    /// # Errors
    /// As [`Client::public_key`].
    pub fn public_key(&self, name: &str) -> Result<PublicKey, Error> {
        self.runtime.block_on(self.inner.public_key(name))
    }

    /// Signs a message or a digest. See [`Client::sign`].
    ///
    /// # Errors
    /// As [`Client::sign`].
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, SignInput, SignOptions};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// let digest = [0u8; 32].to_vec();
    /// let signature = client.sign("web", SignInput::Digest(digest), &SignOptions::new())?;
    /// std::fs::write("web.sig", signature.bytes())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sign(&self, name: &str, input: SignInput, options: &SignOptions) -> Result<Signature, Error> {
        self.runtime.block_on(self.inner.sign(name, input, options))
    }

    /// Checks a signature. See [`Client::verify`].
    ///
    /// # Errors
    /// As [`Client::verify`].
    pub fn verify(&self, name: &str, input: SignInput, signature: &[u8], options: &SignOptions) -> Result<bool, Error> {
        self.runtime.block_on(self.inner.verify(name, input, signature, options))
    }

    /// The daemon's and the TPM's state. See [`Client::status`].
    ///
    /// # Errors
    /// As [`Client::status`].
    pub fn status(&self) -> Result<DaemonStatus, Error> {
        self.runtime.block_on(self.inner.status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_socket_is_a_transport_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = BlockingClient::connect(dir.path().join("none.sock")).unwrap_err();
        assert!(err.is_daemon_down(), "{err}");
    }
}
