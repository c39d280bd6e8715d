//! The host names that every `produced` entry of one runtime declares ([`Claims`]), shared by
//! the entries of all its synced types.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::driver::ObjectKey;

use super::index::Declared;
use super::names::produced_for;

/// The host names that the `produced` entries of all synced types of one runtime declare, so that a
/// claim is judged against every other place that declares the same host object, whatever its
/// synced type. An attacker took another namespace's private key through a second synced type: each
/// entry's own index saw no rival.
///
/// Nothing is brought back until every entry the runtime runs has listed its synced objects
/// ([`Claims::expect`], [`Claims::waiting`]): after a restart, an entry that listed first
/// would otherwise copy before the rival places of the others were known.
#[derive(Debug, Default)]
pub struct Claims {
    /// `(produced apiVersion/kind, host name)` → `(entry, synced object)` → `(virtual name,
    /// synced kind)`; an entry is `<Kind>.<group>/` of its synced type and its `namePath`.
    pub(super) by_host_name: Mutex<HashMap<(String, String), Places>>,
    /// The entries the runtime runs → whether each has listed its objects.
    entries: Mutex<BTreeMap<String, bool>>,
}

/// The places that declare one host name, per [`Claims`] entry and synced object: `(virtual
/// name, synced kind)`.
type Places = BTreeMap<(String, ObjectKey), (String, String)>;

impl Claims {
    /// The entry of `produced[]` entry `name_path` of the synced type `api_version` / `kind`.
    pub fn entry(api_version: &str, kind: &str, name_path: &str) -> String {
        format!("{}{name_path}", produced_for(api_version, kind, ""))
    }

    /// The entries of the `produced[]` of `synced` ([`Claims::entry`]); none for a `FromHost`
    /// type (its `produced` declares no host name).
    pub fn entries_of(synced: &vcp_crds::SyncedType) -> Vec<String> {
        synced
            .produced
            .iter()
            .filter(|_| synced.direction.is_to_host())
            .map(|p| Self::entry(&synced.api_version, &synced.kind, &p.name_path))
            .collect()
    }

    /// Waits for `entry` (see [`Claims::entry`]) to list its objects before anything is
    /// brought back (an entry already listed stays so).
    pub fn expect(&self, entry: String) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.entry(entry).or_insert(false);
        }
    }

    /// Stops waiting for `entry` (its produced kind is not served: it lists nothing).
    pub fn unexpect(&self, entry: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(entry);
        }
    }

    /// `entry` has listed its objects (every cache of its driver holds its first list).
    pub(super) fn listed(&self, entry: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(entry.to_string(), true);
        }
    }

    /// The entries not listed yet.
    pub(super) fn waiting(&self) -> Vec<String> {
        self.entries
            .lock()
            .map(|e| {
                e.iter()
                    .filter(|(_, l)| !**l)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records that `key` of `entry` declares `declared` (or nothing) for `produced`, in place
    /// of `before`.
    pub(super) fn declare(
        &self,
        produced: &str,
        (entry, kind): (&str, &str),
        key: &ObjectKey,
        before: Option<&Declared>,
        declared: Option<&Declared>,
    ) {
        let Ok(mut map) = self.by_host_name.lock() else {
            return;
        };
        let id = (entry.to_string(), key.clone());
        if let Some((_, host_name)) = before {
            let slot = (produced.to_string(), host_name.clone());
            if let Some(set) = map.get_mut(&slot) {
                set.remove(&id);
                if set.is_empty() {
                    map.remove(&slot);
                }
            }
        }
        if let Some((virtual_name, host_name)) = declared {
            map.entry((produced.to_string(), host_name.clone()))
                .or_default()
                .insert(id, (virtual_name.clone(), kind.to_string()));
        }
    }

    /// The places of other entries (other synced types, or another `namePath`) that declare
    /// `host_name` of `produced`: `(synced kind, synced object, virtual name)`.
    pub(super) fn others(
        &self,
        produced: &str,
        host_name: &str,
        entry: &str,
    ) -> Vec<(String, ObjectKey, String)> {
        let Ok(map) = self.by_host_name.lock() else {
            return Vec::new();
        };
        map.get(&(produced.to_string(), host_name.to_string()))
            .into_iter()
            .flatten()
            .filter(|((e, _), _)| e != entry)
            .map(|((_, key), (virtual_name, kind))| {
                (kind.clone(), key.clone(), virtual_name.clone())
            })
            .collect()
    }
}
