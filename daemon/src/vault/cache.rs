//! The in-memory cache of parsed key records: bounded, least-recently-used out.
//!
//! A sign request needs its key's parsed record (TPM blobs, public key); reading and parsing the
//! JSON file costs far more than the lookup, so records stay cached. With more keys than
//! [`RecordCache::capacity`] the least recently used record is dropped, so a working set of hot
//! keys stays in memory however many keys are stored. It also counts deletions, so that a
//! record read from the store before a delete finished is not cached after it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::KeyName;

/// Least-recently-used map from key name to a shared value.
#[derive(Debug)]
pub(crate) struct RecordCache<V> {
    map: HashMap<KeyName, (Arc<V>, u64)>,
    /// Last use stamp handed out.
    clock: u64,
    capacity: usize,
    /// Records deleted so far ([`RecordCache::remove_deleted`]).
    deletions: u64,
}

impl<V> RecordCache<V> {
    /// An empty cache holding at most `capacity` (≥ 1) records.
    pub(crate) fn new(capacity: usize) -> Self {
        Self { map: HashMap::new(), clock: 0, capacity: capacity.max(1), deletions: 0 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The cached value, marked as just used.
    pub(crate) fn get(&mut self, name: &KeyName) -> Option<Arc<V>> {
        let now = self.tick();
        self.map.get_mut(name).map(|(v, used)| {
            *used = now;
            v.clone()
        })
    }

    /// Caches `value` under `name`, dropping the least recently used record when full. The
    /// scan is linear, but it only runs on a miss, which has just read and parsed a file.
    pub(crate) fn insert(&mut self, name: KeyName, value: Arc<V>) {
        if !self.map.contains_key(&name) && self.map.len() >= self.capacity {
            if let Some(oldest) = self.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
                self.map.remove(&oldest);
            }
        }
        let now = self.tick();
        self.map.insert(name, (value, now));
    }

    /// Drops `name`, returning its value.
    pub(crate) fn remove(&mut self, name: &KeyName) -> Option<Arc<V>> {
        self.map.remove(name).map(|(v, _)| v)
    }

    /// Deletions so far: read it before reading a record from the store, and pass it to
    /// [`RecordCache::insert_unless_deleted`].
    pub(crate) fn deletions(&self) -> u64 {
        self.deletions
    }

    /// [`RecordCache::insert`], unless a record was deleted since `seen` was read: a record
    /// read before a delete finished is then served to its request only, never cached.
    pub(crate) fn insert_unless_deleted(&mut self, name: KeyName, value: Arc<V>, seen: u64) {
        if self.deletions == seen {
            self.insert(name, value);
        }
    }

    /// Drops `name` because its record was deleted from the store, and counts the deletion.
    pub(crate) fn remove_deleted(&mut self, name: &KeyName) {
        self.deletions += 1;
        self.map.remove(name);
    }

    /// Records cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> KeyName {
        KeyName::try_from(n).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_record_read_before_a_delete_is_not_cached_after_it() {
        let mut c = RecordCache::new(4);
        // A load reads the record, then the key is deleted, then the load would cache it.
        let seen = c.deletions();
        c.remove_deleted(&k("a"));
        c.insert_unless_deleted(k("a"), Arc::new(1), seen);
        assert!(c.get(&k("a")).is_none(), "the deleted key must not come back into the cache");
        // A read after the delete caches as usual.
        c.insert_unless_deleted(k("a"), Arc::new(2), c.deletions());
        assert_eq!(c.get(&k("a")).as_deref(), Some(&2));
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = RecordCache::new(2);
        c.insert(k("a"), Arc::new(1));
        c.insert(k("b"), Arc::new(2));
        assert_eq!(c.get(&k("a")).as_deref(), Some(&1)); // b is now the oldest
        c.insert(k("c"), Arc::new(3));
        assert_eq!(c.len(), 2);
        assert!(c.get(&k("b")).is_none());
        assert_eq!(c.get(&k("a")).as_deref(), Some(&1));
        assert_eq!(c.get(&k("c")).as_deref(), Some(&3));
        // Replacing a cached name never evicts another.
        c.insert(k("c"), Arc::new(4));
        assert_eq!((c.len(), c.get(&k("a")).as_deref(), c.get(&k("c")).as_deref()), (2, Some(&1), Some(&4)));
        assert_eq!(c.remove(&k("a")).as_deref(), Some(&1));
        assert_eq!(c.len(), 1);
    }
}
