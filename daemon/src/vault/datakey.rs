//! Data keys and random bytes: the vault keeps AES keys sealed by the TPM and does the bulk
//! work in-core.
//!
//! A data key is unsealed once (through an encrypted session) into daemon memory, where it is
//! zeroized on drop and evicted after an idle time. It never encrypts data itself (streams of
//! 0.1, format v1, excepted): each new stream gets a stream key of its own, 256 bits from the
//! DRBG, which the data key wraps (AES-256-GCM, a fresh random nonce, see
//! [`crate::crypto::stream`]); the caller encrypts with the stream key, in its own process or
//! through the `Encrypt` RPC. Random bytes come from the DRBG, which the TPM's RNG only seeds:
//! no request costs a TPM round trip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::{blocking, seal, unix_now, Vault};
use crate::crypto::drbg::Drbg;
use crate::crypto::stream::{self, Header, Keying};
use crate::error::Error;
use crate::model::{KeyName, Owner, PcrTarget};
use crate::store::record::RECORD_VERSION;
use crate::store::{DataKeyRecord, OwnerCheck};
use crate::tpm::ClientKey;
use crate::tpm::KeyBlob;

/// An unsealed data key. The key bytes are wiped when the last user drops it.
pub struct DataKey {
    pub name: KeyName,
    /// Generation id written into stream headers.
    pub key_id: [u8; 16],
    key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey").field("name", &self.name).finish_non_exhaustive()
    }
}

impl DataKey {
    /// The key that opens the chunks of a stream with `header`: its unwrapped stream key (v2,
    /// v3) or this key itself (v1).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the stream was made with another key generation, or its
    /// stream key does not open (wrong context, tampered header).
    pub fn chunk_key(&self, header: &Header, context: &[u8]) -> Result<Zeroizing<[u8; 32]>, Error> {
        if header.key_id != self.key_id {
            return Err(Error::invalid(format!(
                "the stream was encrypted with another generation of data key {} (deleted and re-created?)",
                self.name
            )));
        }
        match header.keying {
            Keying::Wrapped { .. } => Ok(stream::unwrap(&self.key, header, context)?),
            Keying::DataKey { .. } => Ok(self.key.clone()),
        }
    }
}

/// Unsealed data keys by name, with their last use.
#[derive(Default)]
pub(crate) struct KeyCache {
    keys: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<KeyName, (Arc<DataKey>, Instant)>,
    /// Data keys deleted so far ([`KeyCache::remove`]): a key unsealed from a record read
    /// before a delete finished is not cached after it.
    deletions: u64,
}

impl KeyCache {
    fn get(&self, name: &KeyName) -> Option<Arc<DataKey>> {
        let mut keys = self.keys.lock().ok()?;
        let entry = keys.map.get_mut(name)?;
        entry.1 = Instant::now();
        Some(entry.0.clone())
    }

    /// Deletions so far; read it before reading a record and pass it to [`KeyCache::put`].
    fn deletions(&self) -> Option<u64> {
        self.keys.lock().ok().map(|k| k.deletions)
    }

    /// Caches `key` unless a data key was deleted since `seen` was read.
    fn put(&self, key: Arc<DataKey>, seen: Option<u64>) {
        if let Ok(mut keys) = self.keys.lock() {
            if Some(keys.deletions) == seen {
                keys.map.insert(key.name.clone(), (key, Instant::now()));
            }
        }
    }

    /// Forgets `name` after its record was deleted (and counts the deletion).
    fn remove(&self, name: &KeyName) {
        if let Ok(mut keys) = self.keys.lock() {
            keys.deletions += 1;
            keys.map.remove(name);
        }
    }

    /// Drops keys idle for longer than `idle` (all of them for `Duration::ZERO`).
    pub(crate) fn evict_idle(&self, idle: Duration) -> usize {
        let Ok(mut keys) = self.keys.lock() else { return 0 };
        let before = keys.map.len();
        keys.map.retain(|_, (_, used)| used.elapsed() < idle && !idle.is_zero());
        before - keys.map.len()
    }
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache").finish_non_exhaustive()
    }
}

/// Seeds a DRBG from the OS and, when reachable, 32 bytes of TPM entropy.
pub(crate) async fn seeded_drbg(tpm: &crate::tpm::TpmHandle) -> Result<Drbg, Error> {
    let tpm_entropy = match tpm.call(ClientKey::DAEMON, "get_random", |t| t.get_random(32)).await {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "no TPM entropy for the DRBG seed; using the OS alone");
            Vec::new()
        }
    };
    Drbg::new(&tpm_entropy)
}

/// Periodically reseeds the DRBG with TPM entropy and evicts idle data keys and unsealed
/// post-quantum keys. Stops when the vault is gone.
pub(crate) fn spawn_maintenance(vault: std::sync::Weak<super::Inner>, idle: Duration) {
    tokio::spawn(async move {
        let tick = idle.min(Duration::from_secs(10)).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(tick).await;
            let Some(inner) = vault.upgrade() else { return };
            let evicted = inner.datakeys.evict_idle(idle);
            if evicted > 0 {
                tracing::debug!(evicted, "idle data keys dropped from memory");
            }
            let evicted = inner.pqkeys.evict_idle(idle);
            if evicted > 0 {
                tracing::debug!(evicted, "idle unsealed post-quantum keys dropped from memory");
            }
            if inner.drbg.reseed_due() {
                let entropy =
                    inner.tpm.call(ClientKey::DAEMON, "get_random", |t| t.get_random(32)).await.unwrap_or_default();
                if let Err(e) = inner.drbg.reseed(&entropy) {
                    tracing::error!(error = %e, "DRBG reseed failed");
                }
            }
        }
    });
}

impl Vault {
    /// Creates a data key: 256 random bits sealed by the TPM, optionally bound to PCRs.
    ///
    /// # Errors
    /// [`Error::KeyExists`], TPM and store errors.
    pub async fn create_data_key(
        &self,
        name: KeyName,
        owner: impl Into<Owner>,
        pcr: Option<PcrTarget>,
    ) -> Result<String, Error> {
        let (owner_uid, owner_certificate) = owner.into().to_fields();
        let store = self.store().clone();
        let n = name.clone();
        if blocking(move || store.datakeys().get(&n)).await?.is_some() {
            return Err(Error::KeyExists(name.clone()));
        }
        let pcr_policy = match pcr {
            Some(t) => Some(self.pcr_policy(&t.selection, t.values).await?),
            None => None,
        };
        let (object, _key) = self.seal_key256("datakey_create", seal::auth_policy(pcr_policy.as_ref())?).await?;
        let mut key_id = [0u8; 16];
        self.random(&mut key_id)?;
        let record = DataKeyRecord {
            version: RECORD_VERSION,
            name: name.clone(),
            created_unix: unix_now(),
            owner_uid,
            owner_certificate,
            key_id: key_id.to_vec(),
            pcr_policy,
            object,
        };
        let store = self.store().clone();
        blocking(move || store.datakeys().insert(&record)).await?;
        tracing::info!(key = %name, "data key created");
        Ok(hex::encode(key_id))
    }

    /// The unsealed data key `name`, from memory or unsealed now.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::PcrMismatch`] naming the PCRs that differ for a
    /// PCR-bound key; TPM errors.
    pub async fn data_key(&self, name: &KeyName) -> Result<Arc<DataKey>, Error> {
        if let Some(k) = self.inner.datakeys.get(name) {
            return Ok(k);
        }
        let deletions = self.inner.datakeys.deletions();
        let store = self.store().clone();
        let n = name.clone();
        let record = blocking(move || store.datakeys().get(&n)).await?.ok_or_else(|| Error::not_found(name))?;
        let blob = KeyBlob::try_from(&record.object)?;
        let key = self.unseal_key256(&format!("data key {name}"), blob, record.pcr_policy.as_ref()).await?;
        let mut key_id = [0u8; 16];
        key_id.copy_from_slice(&record.key_id);
        let dk = Arc::new(DataKey { name: name.clone(), key_id, key });
        self.inner.datakeys.put(dk.clone(), deletions);
        Ok(dk)
    }

    /// A new stream under data key `name` (format v3): its header, which carries a new stream
    /// key wrapped by the data key and bound to `context`, and that stream key. Both the stream
    /// key and the wrapping nonce come from the DRBG; the data key never leaves the vault.
    ///
    /// # Errors
    /// As [`Vault::data_key`]; RNG or cipher failures.
    pub async fn new_stream(&self, name: &KeyName, context: &[u8]) -> Result<(Header, Zeroizing<[u8; 32]>), Error> {
        let dk = self.data_key(name).await?;
        let mut stream_key = Zeroizing::new([0u8; 32]);
        self.random(stream_key.as_mut())?;
        let mut nonce = [0u8; 12];
        self.random(&mut nonce)?;
        let id = stream::DataKeyId { name: dk.name.as_str(), id: dk.key_id };
        let header = stream::wrap(&dk.key, id, stream::CHUNK as u32, context, nonce, &stream_key)?;
        Ok((header, stream_key))
    }

    /// The key that opens the chunks of the stream with `header`, under the data key it names
    /// (see [`DataKey::chunk_key`]).
    ///
    /// # Errors
    /// As [`Vault::data_key`] and [`DataKey::chunk_key`].
    pub async fn open_stream(&self, header: &Header, context: &[u8]) -> Result<Zeroizing<[u8; 32]>, Error> {
        let name = KeyName::try_from(header.key_name.as_str())?;
        self.data_key(&name).await?.chunk_key(header, context)
    }

    /// The MAC key of the v3 stream with `header` and `context`, under the data key it names
    /// ([`stream::mac_key`]), once the header's stream key opened (so the header is one the
    /// data key made). It stays in the daemon: it makes and checks commitments, never handed out.
    ///
    /// # Errors
    /// As [`Vault::open_stream`]; [`Error::InvalidArgument`] for a header of another version.
    pub async fn stream_mac_key(&self, header: &Header, context: &[u8]) -> Result<Zeroizing<[u8; 32]>, Error> {
        let name = KeyName::try_from(header.key_name.as_str())?;
        let dk = self.data_key(&name).await?;
        drop(dk.chunk_key(header, context)?);
        Ok(stream::mac_key(&dk.key, header, context)?)
    }

    /// Deletes a data key (and forgets its unsealed copy) when `check` allows it for the key's
    /// owner, checked under the store's write lock. Streams encrypted under it can no longer
    /// be decrypted.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::PermissionDenied`] when the check refuses; store errors.
    pub async fn delete_data_key(&self, name: &KeyName, check: OwnerCheck) -> Result<(), Error> {
        self.inner.datakeys.remove(name);
        let store = self.store().clone();
        let n = name.clone();
        let existed = blocking(move || store.datakeys().remove_checked(&n, &check)).await?;
        // An unseal that read the record before the removal must not cache the key now.
        self.inner.datakeys.remove(name);
        if existed {
            Ok(())
        } else {
            Err(Error::not_found(name))
        }
    }

    /// Forgets every unsealed data key (the next use unseals again, and so re-checks PCRs).
    pub fn evict_data_keys(&self) -> usize {
        self.inner.datakeys.evict_idle(Duration::ZERO)
    }

    /// Fills `out` from the DRBG (no TPM round trip).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for oversize requests.
    pub fn random(&self, out: &mut [u8]) -> Result<(), Error> {
        self.inner.drbg.fill(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_read_before_a_delete_is_not_cached_after_it() {
        let cache = KeyCache::default();
        let name = KeyName::try_from("dk").unwrap_or_else(|e| panic!("{e}"));
        let key = || Arc::new(DataKey { name: name.clone(), key_id: [1; 16], key: Zeroizing::new([2; 32]) });
        // A use reads the record, then the key is deleted, then the use finishes unsealing.
        let seen = cache.deletions();
        cache.remove(&name);
        cache.put(key(), seen);
        assert!(cache.get(&name).is_none(), "the deleted key must not come back into the cache");
        // A read after the delete caches as usual.
        cache.put(key(), cache.deletions());
        assert!(cache.get(&name).is_some());
    }
}
