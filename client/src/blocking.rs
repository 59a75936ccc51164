//! [`BlockingClient`]: the [`Client`] calls for synchronous code.
//!
//! Owns a private current-thread tokio runtime and drives each call to completion with
//! `block_on`, as mini-redis' blocking client does. It adds no behaviour of its own.

use std::io::{Read, Write};
use std::path::Path;

use tokio::runtime::Runtime;
use zeroize::Zeroizing;

use crate::sync_io::SyncIo;
use crate::{
    AccessCheck, AttestationKey, Operation, PcrValues, PolicyApproval, Quote, SealInfo, SealOptions, SignedPolicy,
};
use crate::{
    Client, ClientBuilder, DaemonStatus, DataKey, Error, KeyAlgorithm, KeyAuth, KeyInfo, PcrBinding, PublicKey,
    SignInput, SignOptions, Signature,
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

    /// Creates a key that needs a password. See [`Client::create_key_with_auth`].
    ///
    /// # Errors
    /// As [`Client::create_key`].
    pub fn create_key_with_auth(&self, name: &str, algorithm: KeyAlgorithm, auth: &KeyAuth) -> Result<KeyInfo, Error> {
        self.runtime.block_on(self.inner.create_key_with_auth(name, algorithm, auth))
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

    /// The access-policy decision for a local user. See [`Client::check_access`].
    ///
    /// # Errors
    /// As [`Client::check_access`].
    pub fn check_access(&self, uid: u32, operation: Operation, key: Option<&str>) -> Result<AccessCheck, Error> {
        self.runtime.block_on(self.inner.check_access(uid, operation, key))
    }

    /// The attestation and endorsement keys. See [`Client::attestation_key`].
    ///
    /// # Errors
    /// As [`Client::attestation_key`].
    pub fn attestation_key(&self) -> Result<AttestationKey, Error> {
        self.runtime.block_on(self.inner.attestation_key())
    }

    /// Quotes PCRs over a nonce. See [`Client::quote`].
    ///
    /// # Errors
    /// As [`Client::quote`].
    pub fn quote(&self, pcrs: &PcrBinding, nonce: &[u8]) -> Result<Quote, Error> {
        self.runtime.block_on(self.inner.quote(pcrs, nonce))
    }

    /// Reads PCR values. See [`Client::read_pcrs`].
    ///
    /// # Errors
    /// As [`Client::read_pcrs`].
    pub fn read_pcrs(&self, pcrs: Option<&PcrBinding>) -> Result<PcrValues, Error> {
        self.runtime.block_on(self.inner.read_pcrs(pcrs))
    }

    /// Recovers a credential made for the AK. See [`Client::activate_credential`].
    ///
    /// # Errors
    /// As [`Client::activate_credential`].
    pub fn activate_credential(
        &self,
        credential_blob: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.activate_credential(credential_blob, encrypted_secret))
    }

    /// The device's event log and its path on the device. See [`Client::event_log`].
    ///
    /// # Errors
    /// As [`Client::event_log`].
    pub fn event_log(&self) -> Result<(Vec<u8>, String), Error> {
        self.runtime.block_on(self.inner.event_log())
    }

    /// Seals a secret. See [`Client::seal`].
    ///
    /// # Errors
    /// As [`Client::seal`].
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, SealOptions};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// client.seal("disk", b"hunter2", &SealOptions::new().with_pcrs("sha256:9".parse()?))?;
    /// assert_eq!(client.unseal("disk", None)?.as_slice(), b"hunter2");
    /// # Ok::<(), tpm_vault_client::Error>(())
    /// ```
    pub fn seal(&self, name: &str, secret: &[u8], options: &SealOptions) -> Result<SealInfo, Error> {
        self.runtime.block_on(self.inner.seal(name, secret, options))
    }

    /// Unseals a secret. See [`Client::unseal`].
    ///
    /// # Errors
    /// As [`Client::unseal`].
    pub fn unseal(&self, name: &str, signed_policy: Option<&[u8]>) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.runtime.block_on(self.inner.unseal(name, signed_policy))
    }

    /// Deletes a sealed secret. See [`Client::delete_sealed`].
    ///
    /// # Errors
    /// As [`Client::delete_sealed`].
    pub fn delete_sealed(&self, name: &str) -> Result<(), Error> {
        self.runtime.block_on(self.inner.delete_sealed(name))
    }

    /// Approves PCR values with a vault key. See [`Client::sign_policy`].
    ///
    /// # Errors
    /// As [`Client::sign_policy`].
    pub fn sign_policy(&self, key_name: &str, approval: &PolicyApproval) -> Result<SignedPolicy, Error> {
        self.runtime.block_on(self.inner.sign_policy(key_name, approval))
    }

    /// Creates a data key. See [`Client::create_data_key`].
    ///
    /// # Errors
    /// As [`Client::create_data_key`].
    pub fn create_data_key(&self, name: &str, pcr_binding: Option<PcrBinding>) -> Result<DataKey, Error> {
        self.runtime.block_on(self.inner.create_data_key(name, pcr_binding))
    }

    /// Deletes a data key. See [`Client::delete_data_key`].
    ///
    /// # Errors
    /// As [`Client::delete_data_key`].
    pub fn delete_data_key(&self, name: &str) -> Result<(), Error> {
        self.runtime.block_on(self.inner.delete_data_key(name))
    }

    /// Random bytes from the daemon. See [`Client::random`].
    ///
    /// # Errors
    /// As [`Client::random`].
    pub fn random(&self, len: usize) -> Result<Vec<u8>, Error> {
        self.runtime.block_on(self.inner.random(len))
    }

    /// Encrypts everything `reader` yields into `writer` with data key `key`. See
    /// [`Client::copy_encrypt`]; returns the bytes written.
    ///
    /// # Errors
    /// As [`Client::copy_encrypt`].
    ///
    /// # Examples
    /// ```no_run
    /// use std::fs::File;
    /// use tpm_vault_client::BlockingClient;
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// let mut plain = File::open("backup.tar")?;
    /// let mut sealed = File::create("backup.tar.sealed")?;
    /// client.encrypt("backups", b"", &mut plain, &mut sealed)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn encrypt(
        &self,
        key: &str,
        context: &[u8],
        reader: &mut (impl Read + ?Sized),
        writer: &mut (impl Write + ?Sized),
    ) -> Result<u64, Error> {
        let (mut reader, mut writer) = (SyncIo(reader), SyncIo(writer));
        self.runtime.block_on(self.inner.copy_encrypt(key, context, &mut reader, &mut writer))
    }

    /// Decrypts a stream made by [`encrypt`](BlockingClient::encrypt) into `writer`. See
    /// [`Client::copy_decrypt`], including what `writer` holds after an error.
    ///
    /// # Errors
    /// As [`Client::copy_decrypt`].
    pub fn decrypt(
        &self,
        context: &[u8],
        reader: &mut (impl Read + ?Sized),
        writer: &mut (impl Write + ?Sized),
    ) -> Result<u64, Error> {
        let (mut reader, mut writer) = (SyncIo(reader), SyncIo(writer));
        self.runtime.block_on(self.inner.copy_decrypt(context, &mut reader, &mut writer))
    }

    /// [`encrypt`](BlockingClient::encrypt) with the AES work in the daemon. See
    /// [`Client::copy_encrypt_in_daemon`].
    ///
    /// # Errors
    /// As [`Client::copy_encrypt`].
    pub fn encrypt_in_daemon(
        &self,
        key: &str,
        context: &[u8],
        reader: &mut (impl Read + ?Sized),
        writer: &mut (impl Write + ?Sized),
    ) -> Result<u64, Error> {
        let (mut reader, mut writer) = (SyncIo(reader), SyncIo(writer));
        self.runtime.block_on(self.inner.copy_encrypt_in_daemon(key, context, &mut reader, &mut writer))
    }

    /// [`decrypt`](BlockingClient::decrypt) with the AES work in the daemon. See
    /// [`Client::copy_decrypt_in_daemon`].
    ///
    /// # Errors
    /// As [`Client::copy_decrypt`].
    pub fn decrypt_in_daemon(
        &self,
        context: &[u8],
        reader: &mut (impl Read + ?Sized),
        writer: &mut (impl Write + ?Sized),
    ) -> Result<u64, Error> {
        let (mut reader, mut writer) = (SyncIo(reader), SyncIo(writer));
        self.runtime.block_on(self.inner.copy_decrypt_in_daemon(context, &mut reader, &mut writer))
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
