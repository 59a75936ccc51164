//! [`BlockingClient`]: the [`Client`] calls for synchronous code.
//!
//! Owns a private current-thread tokio runtime and drives each call to completion with
//! `block_on`, as mini-redis' blocking client does. It adds no behaviour of its own: its methods
//! are generated from a list of [`Client`]'s signatures (the `blocking!` macro), and
//! [`BlockingClient::call`] runs any other `Client` call; only the streaming encrypt and decrypt
//! calls are written out, to adapt `std::io` readers and writers.

use std::future::Future;
use std::io::{Read, Write};
use std::path::Path;

use tokio::runtime::Runtime;
use zeroize::Zeroizing;

use crate::sync_io::SyncIo;
use crate::{
    AccessCheck, AttestationKey, Operation, PcrValues, PolicyApproval, Quote, SealInfo, SealOptions, SignedPolicy,
};
use crate::{
    Client, ClientBuilder, DaemonStatus, DataKey, Error, KeyAlgorithm, KeyAuth, KeyInfo, KeyUsage, PcrBinding,
    PublicKey, SignInput, SignOptions, Signature,
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

/// The blocking twins of [`Client`]'s methods, each listed once by its signature: it calls
/// the method of the same name on the runtime, with the same arguments.
macro_rules! blocking {
    ($(
        $(#[$doc:meta])*
        fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
    )*) => {
        impl BlockingClient {$(
            $(#[$doc])*
            #[doc = concat!("\n\nSee [`Client::", stringify!($name), "`].\n\n# Errors\nAs [`Client::", stringify!($name), "`].")]
            pub fn $name(&self $(, $arg: $ty)*) -> Result<$ret, Error> {
                self.runtime.block_on(self.inner.$name($($arg),*))
            }
        )*}
    };
}

blocking! {
    /// Creates a key inside the TPM.
    fn create_key(&self, name: &str, algorithm: KeyAlgorithm, pcr_binding: Option<PcrBinding>) -> KeyInfo;
    /// Creates a key with the usages given (and optionally a password).
    fn create_key_with_usages(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        pcr_binding: Option<PcrBinding>,
        auth: Option<&KeyAuth>,
        usages: &[KeyUsage],
    ) -> KeyInfo;
    /// Narrows a key's usages.
    fn set_key_usage(&self, name: &str, usages: &[KeyUsage]) -> KeyInfo;
    /// Creates a key that needs a password.
    fn create_key_with_auth(&self, name: &str, algorithm: KeyAlgorithm, auth: &KeyAuth) -> KeyInfo;
    /// A key's metadata.
    fn key(&self, name: &str) -> KeyInfo;
    /// Every key the caller may see.
    fn list_keys(&self) -> Vec<KeyInfo>;
    /// Deletes a key.
    fn delete_key(&self, name: &str) -> ();
    /// A key's public part.
    fn public_key(&self, name: &str) -> PublicKey;
    /// Signs a message or a digest.
    ///
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, SignInput, SignOptions};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// let digest = [0u8; 32].to_vec();
    /// let signature = client.sign("web", SignInput::Digest(digest), &SignOptions::new())?;
    /// std::fs::write("web.sig", signature.bytes())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn sign(&self, name: &str, input: SignInput, options: &SignOptions) -> Signature;
    /// Checks a signature.
    fn verify(&self, name: &str, input: SignInput, signature: &[u8], options: &SignOptions) -> bool;
    /// The daemon's and the TPM's state.
    fn status(&self) -> DaemonStatus;
    /// The access-policy decision for a local user.
    fn check_access(&self, uid: u32, operation: Operation, key: Option<&str>) -> AccessCheck;
    /// The attestation and endorsement keys.
    fn attestation_key(&self) -> AttestationKey;
    /// Quotes PCRs over a nonce.
    fn quote(&self, pcrs: &PcrBinding, nonce: &[u8]) -> Quote;
    /// Reads PCR values.
    fn read_pcrs(&self, pcrs: Option<&PcrBinding>) -> PcrValues;
    /// Recovers a credential made for the AK.
    fn activate_credential(&self, credential_blob: &[u8], encrypted_secret: &[u8]) -> Zeroizing<Vec<u8>>;
    /// The device's event log and its path on the device.
    fn event_log(&self) -> (Vec<u8>, String);
    /// Seals a secret.
    ///
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, SealOptions};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// client.seal("disk", b"hunter2", &SealOptions::new().with_pcrs("sha256:9".parse()?))?;
    /// assert_eq!(client.unseal("disk", None)?.as_slice(), b"hunter2");
    /// # Ok::<(), tpm_vault_client::Error>(())
    /// ```
    fn seal(&self, name: &str, secret: &[u8], options: &SealOptions) -> SealInfo;
    /// Unseals a secret.
    fn unseal(&self, name: &str, signed_policy: Option<&[u8]>) -> Zeroizing<Vec<u8>>;
    /// Deletes a sealed secret.
    fn delete_sealed(&self, name: &str) -> ();
    /// Approves PCR values with a vault key.
    fn sign_policy(&self, key_name: &str, approval: &PolicyApproval) -> SignedPolicy;
    /// Creates a data key.
    fn create_data_key(&self, name: &str, pcr_binding: Option<PcrBinding>) -> DataKey;
    /// Deletes a data key.
    fn delete_data_key(&self, name: &str) -> ();
    /// Random bytes from the daemon.
    fn random(&self, len: usize) -> Vec<u8>;
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

    /// Runs `call` with the async client and waits for its result: every [`Client`] method,
    /// also those without a blocking twin below.
    ///
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, KeyUsage};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// let info = client.call(|c| c.set_key_usage("web", &[KeyUsage::Sign]))?;
    /// # Ok::<(), tpm_vault_client::Error>(())
    /// ```
    pub fn call<'a, T, F: Future<Output = T>>(&'a self, call: impl FnOnce(&'a Client) -> F) -> T {
        self.runtime.block_on(call(&self.inner))
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
