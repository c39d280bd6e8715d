//! What one entry's watches told about names ([`Index`]): which synced object declares which
//! virtual and host name, and which virtual objects are marked as its copies.

use std::collections::{BTreeSet, HashMap};

use crate::driver::ObjectKey;

/// The names a synced object declares: `(virtual name, host name of the virtual name)`.
pub(super) type Declared = (String, String);

/// What the watches told about names (hints: every reconcile reads the caches again).
#[derive(Default)]
pub(super) struct Index {
    /// Synced object → what its virtual object declares.
    pub(super) declared: HashMap<ObjectKey, Declared>,
    /// Host name of a declared virtual name → the synced objects declaring it.
    pub(super) by_host_name: HashMap<String, BTreeSet<ObjectKey>>,
    /// `(namespace, virtual name)` → the synced objects declaring it.
    pub(super) by_virtual_name: HashMap<(String, String), BTreeSet<ObjectKey>>,
    /// Synced object → the virtual objects marked as its copies.
    pub(super) copies: HashMap<ObjectKey, BTreeSet<String>>,
}

impl Index {
    /// Records what `key` declares (`None`: nothing, or it is gone) and returns the other
    /// synced objects that declare the host name it declared before or declares now: a rival
    /// that comes or goes changes their [`claim`], so they are reconciled too.
    pub(super) fn declare(
        &mut self,
        key: &ObjectKey,
        declared: Option<Declared>,
    ) -> BTreeSet<ObjectKey> {
        let mut rivals = BTreeSet::new();
        let names = self
            .declared
            .get(key)
            .map(|d| d.1.clone())
            .into_iter()
            .chain(declared.as_ref().map(|d| d.1.clone()));
        for host_name in names {
            rivals.extend(
                self.by_host_name
                    .get(&host_name)
                    .into_iter()
                    .flatten()
                    .filter(|k| *k != key)
                    .cloned(),
            );
        }
        if let Some((virtual_name, host_name)) = self.declared.remove(key) {
            remove(&mut self.by_host_name, &host_name, key);
            remove(
                &mut self.by_virtual_name,
                &(key.namespace.clone(), virtual_name),
                key,
            );
        }
        if let Some((virtual_name, host_name)) = declared {
            self.by_host_name
                .entry(host_name.clone())
                .or_default()
                .insert(key.clone());
            self.by_virtual_name
                .entry((key.namespace.clone(), virtual_name.clone()))
                .or_default()
                .insert(key.clone());
            self.declared.insert(key.clone(), (virtual_name, host_name));
        }
        rivals
    }

    pub(super) fn copy(&mut self, key: &ObjectKey, name: &str, deleted: bool) {
        if deleted {
            remove(&mut self.copies, key, &name.to_string());
        } else {
            self.copies
                .entry(key.clone())
                .or_default()
                .insert(name.to_string());
        }
    }
}

fn remove<K: std::hash::Hash + Eq, V: Ord>(map: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V) {
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
