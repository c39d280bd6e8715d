//! A compact watch cache: the objects of one watch kept as their serialized JSON, parsed again
//! when a worker reads one (no I/O here; the controller feeds it the watch events).
//!
//! Why not kube-runtime's reflector store: it keeps every object parsed, and a parsed object
//! is several times the size of its JSON (each `ObjectMeta` is a wide struct, every label,
//! annotation and JSON map a B-tree node allocated for eleven entries, and every store key an
//! `ObjectRef` with its own copy of the `ApiResource`). With 10,000 synced objects cached on
//! both sides that made most of the runtime's memory (`docs/BENCHMARKS.md`, "Sync runtime").
//! Here an entry is the object's compact JSON under its `(namespace, name)` (the controller
//! hands it objects already without `managedFields`,
//! [`slim_for_cache`](crate::translate::slim_for_cache)), LZ4-compressed (`lz4_flex`'s block
//! format, size prepended) with the JSON of the first object the cache ever stored as the
//! dictionary: objects of one watch share nearly all their bytes (keys, the vCluster's labels
//! and annotations, owner reference, spec), so a 1.1 KiB host copy of the bench's Car takes
//! about 170 bytes. A read costs one decompression and one parse of a few hundred bytes, done
//! only when a key is reconciled. The dictionary is kept for the life of the cache (a re-list
//! keeps it: entries are never re-encoded); an atypical first object only makes the
//! compression weaker, never wrong.
//!
//! Event semantics are those of a reflector store: `Init` starts a new listing, `InitApply`
//! adds to it, `InitDone` replaces the contents with it and marks the cache ready; `Apply`
//! inserts or replaces, `Delete` removes.
//!
//! Beside the objects, the keys of the watch's objects that could not be decoded
//! ([`Cache::skip`], `vcp_crds::tolerant`) and why: such an object is not cached, and
//! its key is kept apart so that a reconcile can tell "undecodable" from "missing"
//! ([`Cache::undecodable`]); a listing rebuilds that set like the objects, an object that decodes
//! again or is deleted leaves it.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::RwLock;

use kube::Resource;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;
use vcp_crds::tolerant::Skipped;

/// `(namespace, name)` of a cached object (namespace empty for cluster-scoped objects).
pub(crate) type CacheKey = (String, String);

struct Contents {
    objects: HashMap<CacheKey, Box<[u8]>>,
    /// The listing in progress between `Init` and `InitDone`.
    listing: Option<HashMap<CacheKey, Box<[u8]>>>,
    /// The compression dictionary: the JSON of the first object stored (module docs).
    dictionary: Option<Box<[u8]>>,
    /// Keys of the objects that could not be decoded → why (module docs).
    undecodable: HashMap<CacheKey, String>,
    /// The undecodable keys of the listing in progress.
    listing_undecodable: HashMap<CacheKey, String>,
}

/// The longest decoding error a [`Cache`] keeps per undecodable object (bytes, cut at a
/// character boundary): a path 140 levels deep is ~300 bytes; the set stays small even when a
/// tenant makes thousands of such objects.
pub(crate) const MAX_UNDECODABLE_ERROR: usize = 512;

/// The objects of one watch (see the module docs).
pub(crate) struct Cache<K> {
    contents: RwLock<Contents>,
    ready: watch::Sender<bool>,
    _kind: PhantomData<fn() -> K>,
}

impl<K: Resource + Serialize + DeserializeOwned> Cache<K> {
    /// An empty cache, not ready.
    pub(crate) fn new() -> Self {
        Self {
            contents: RwLock::new(Contents {
                objects: HashMap::new(),
                listing: None,
                dictionary: None,
                undecodable: HashMap::new(),
                listing_undecodable: HashMap::new(),
            }),
            ready: watch::channel(false).0,
            _kind: PhantomData,
        }
    }

    /// Applies one watch event (see the module docs for the semantics); returns whether the
    /// set of undecodable keys changed (an object that decodes again, a listing done).
    pub(crate) fn apply(&self, event: &watcher::Event<K>) -> bool {
        let Ok(mut contents) = self.contents.write() else {
            return false;
        };
        let mut changed = false;
        match event {
            watcher::Event::Init => {
                contents.listing = Some(HashMap::new());
                contents.listing_undecodable = HashMap::new();
            }
            watcher::Event::InitApply(obj) => {
                contents.listing_undecodable.remove(&key_of(obj));
                if let Some(entry) = encode(obj, &mut contents.dictionary) {
                    contents
                        .listing
                        .get_or_insert_with(HashMap::new)
                        .insert(entry.0, entry.1);
                }
            }
            watcher::Event::InitDone => {
                let mut listing = contents.listing.take().unwrap_or_default();
                listing.shrink_to_fit();
                contents.objects = listing;
                let listed = std::mem::take(&mut contents.listing_undecodable);
                changed = !(listed.is_empty() && contents.undecodable.is_empty());
                contents.undecodable = listed;
                drop(contents);
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(obj) => {
                changed = contents.undecodable.remove(&key_of(obj)).is_some();
                if let Some((key, bytes)) = encode(obj, &mut contents.dictionary) {
                    contents.objects.insert(key, bytes);
                }
            }
            watcher::Event::Delete(obj) => {
                let key = key_of(obj);
                changed = contents.undecodable.remove(&key).is_some();
                contents.objects.remove(&key);
            }
        }
        changed
    }

    /// Records that the object `skipped` names could not be decoded (module docs): during a
    /// listing, in the listing's set; otherwise its cached version, if any, leaves the cache
    /// (and is returned, so that the keys it touched are reconciled) and its key enters the
    /// set. A skipped delete event (deleted while undecodable) takes the key out of both sets.
    pub(crate) fn skip(&self, skipped: &Skipped) -> Option<K> {
        let key = (
            skipped.metadata.namespace.clone().unwrap_or_default(),
            skipped.metadata.name.clone().unwrap_or_default(),
        );
        let Ok(mut contents) = self.contents.write() else {
            return None;
        };
        let error = cut(&skipped.error, MAX_UNDECODABLE_ERROR);
        if skipped.deleted {
            contents.undecodable.remove(&key);
            contents.listing_undecodable.remove(&key);
            let previous = contents.objects.remove(&key)?;
            return decode(&previous, &contents.dictionary, &key.0, &key.1);
        }
        if let Some(listing) = contents.listing.as_mut() {
            listing.remove(&key);
            contents.listing_undecodable.insert(key, error);
            return None;
        }
        let previous = contents.objects.remove(&key);
        let previous = previous.and_then(|p| decode(&p, &contents.dictionary, &key.0, &key.1));
        contents.undecodable.insert(key, error);
        previous
    }

    /// Why the object `namespace/name` could not be decoded, when it is one of the watch's
    /// undecodable objects (module docs); `None` for an object that decoded or does not exist.
    pub(crate) fn undecodable(&self, namespace: &str, name: &str) -> Option<String> {
        let contents = self.contents.read().ok()?;
        contents
            .undecodable
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// How many of the watch's objects are undecodable, and the first of them in key order
    /// (`namespace/name: error`).
    pub(crate) fn undecodable_summary(&self) -> (usize, Option<String>) {
        let Ok(contents) = self.contents.read() else {
            return (0, None);
        };
        let first =
            contents
                .undecodable
                .iter()
                .min_by(|a, b| a.0.cmp(b.0))
                .map(|((ns, name), error)| match ns.as_str() {
                    "" => format!("{name}: {error}"),
                    _ => format!("{ns}/{name}: {error}"),
                });
        (contents.undecodable.len(), first)
    }

    /// The object `namespace/name`, parsed; `None` when it is not cached.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<K> {
        let contents = self.contents.read().ok()?;
        let entry = contents
            .objects
            .get(&(namespace.to_string(), name.to_string()))?;
        decode(entry, &contents.dictionary, namespace, name)
    }

    /// The keys of every cached object.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<CacheKey> {
        self.contents
            .read()
            .map(|c| c.objects.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Calls `f` with the `(namespace, name)` of every cached object, under the cache's read
    /// lock (no list of the keys is made: a full resync of 50,000 objects pushes them straight
    /// into the work queue, `docs/BENCHMARKS.md`, "Sync runtime"). `f` must not use this cache.
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&str, &str)) {
        if let Ok(contents) = self.contents.read() {
            for (namespace, name) in contents.objects.keys() {
                f(namespace, name);
            }
        }
    }

    /// Calls `f` with every cached object that parses, under the cache's read lock; each
    /// object is parsed just before `f` takes it and dropped after, so at most one parsed
    /// object lives at a time (a parsed object is several times its JSON: parsing all 50,000
    /// host copies at once to compute their keys took the restarted runtime's peak RSS from 127
    /// to 459 MiB, `docs/BENCHMARKS.md`, "Sync runtime"). `f` must not use this cache.
    pub(crate) fn for_each(&self, mut f: impl FnMut(K)) {
        if let Ok(contents) = self.contents.read() {
            for ((namespace, name), entry) in &contents.objects {
                if let Some(obj) = decode(entry, &contents.dictionary, namespace, name) {
                    f(obj);
                }
            }
        }
    }

    /// Every cached object, parsed (objects that fail to parse are left out).
    #[cfg(test)]
    pub(crate) fn objects(&self) -> Vec<K> {
        let mut out = Vec::new();
        self.for_each(|obj| out.push(obj));
        out
    }

    /// Number of cached objects.
    pub(crate) fn len(&self) -> usize {
        self.contents.read().map(|c| c.objects.len()).unwrap_or(0)
    }

    /// Resolves once the first listing is complete.
    pub(crate) async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// `text` cut to at most `max` bytes at character boundaries: its first and last halves with
/// `…` between them when cut (a deep path's start and the error's message at its end).
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut head = max / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - max / 2;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…{}", &text[..head], &text[tail..])
}

fn key_of<K: Resource>(obj: &K) -> CacheKey {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Parses cache entry `entry` of `namespace/name` (its LZ4 block decompressed with
/// `dictionary`); `None`, with a warning, when it does not decompress or parse.
fn decode<K: DeserializeOwned>(
    entry: &[u8],
    dictionary: &Option<Box<[u8]>>,
    namespace: &str,
    name: &str,
) -> Option<K> {
    let dictionary = dictionary.as_deref().unwrap_or_default();
    let bytes = match lz4_flex::block::decompress_size_prepended_with_dict(entry, dictionary) {
        Ok(bytes) => bytes,
        Err(error) => {
            warn!(%namespace, %name, %error, "cannot decompress a cached object");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(obj) => Some(obj),
        Err(error) => {
            warn!(%namespace, %name, %error, "cannot parse a cached object");
            None
        }
    }
}

/// The entry of `obj`: its key and its JSON compressed with `dictionary`, which is set to that
/// JSON when it is still empty (the cache's first object).
fn encode<K: Resource + Serialize>(
    obj: &K,
    dictionary: &mut Option<Box<[u8]>>,
) -> Option<(CacheKey, Box<[u8]>)> {
    let key = key_of(obj);
    match serde_json::to_vec(obj) {
        Ok(json) => {
            let dictionary = dictionary.get_or_insert_with(|| json.clone().into_boxed_slice());
            let entry = lz4_flex::block::compress_prepend_size_with_dict(&json, dictionary);
            Some((key, entry.into_boxed_slice()))
        }
        Err(error) => {
            warn!(namespace = %key.0, name = %key.1, %error, "cannot cache an object");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::slim_for_cache;
    use kube::api::DynamicObject;
    use serde_json::json;

    /// A Car as the controller hands it to the cache (without `managedFields`).
    fn car(name: &str, rv: &str) -> DynamicObject {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {
                "name": name, "namespace": "ns", "uid": "u", "resourceVersion": rv,
                "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
                "labels": {"l": "1"}, "annotations": {"a": "1"},
                "managedFields": [{"manager": "m", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"type": "BMW", "seats": 4}, "status": {"ok": true}
        }))
        .unwrap();
        slim_for_cache(&mut obj.metadata);
        obj
    }

    #[tokio::test]
    async fn listing_then_events() {
        let cache = Cache::<DynamicObject>::new();
        assert_eq!(cache.len(), 0);
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("a", "1")));
        cache.apply(&watcher::Event::InitApply(car("b", "1")));
        // the listing is not visible before InitDone
        assert_eq!(cache.get("ns", "a"), None);
        cache.apply(&watcher::Event::InitDone);
        cache.wait_until_ready().await;
        assert_eq!(cache.len(), 2);
        // the JSON round trip gives the object back as it was handed in
        assert_eq!(cache.get("ns", "a"), Some(car("a", "1")));
        cache.apply(&watcher::Event::Apply(car("a", "2")));
        assert_eq!(
            cache
                .get("ns", "a")
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("2")
        );
        cache.apply(&watcher::Event::Delete(car("b", "1")));
        assert_eq!(cache.get("ns", "b"), None);
        let mut keys = cache.keys();
        keys.sort();
        assert_eq!(keys, vec![("ns".to_string(), "a".to_string())]);
        assert_eq!(cache.objects(), vec![car("a", "2")]);
        assert_eq!(cache.get("other", "a"), None);
    }

    #[test]
    fn entries_are_compressed_against_the_first_object_and_read_back_whole() {
        let cache = Cache::<DynamicObject>::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("first", "1")));
        cache.apply(&watcher::Event::InitDone);
        let other = car("second-with-a-longer-name", "2");
        cache.apply(&watcher::Event::Apply(other.clone()));
        let json = serde_json::to_vec(&other).unwrap().len();
        let stored = {
            let contents = cache.contents.read().unwrap();
            contents.objects[&("ns".to_string(), "second-with-a-longer-name".to_string())].len()
        };
        assert!(
            stored * 3 < json,
            "a look-alike of the first object takes under a third of its JSON: {stored} of {json} bytes"
        );
        assert_eq!(cache.get("ns", "second-with-a-longer-name"), Some(other));
        assert_eq!(cache.get("ns", "first"), Some(car("first", "1")));
    }

    #[test]
    fn for_each_hands_over_each_parsed_object_and_for_each_key_each_key() {
        let cache = Cache::<DynamicObject>::new();
        cache.apply(&watcher::Event::Init);
        for (name, rv) in [("a", "1"), ("b", "2"), ("c", "3")] {
            cache.apply(&watcher::Event::InitApply(car(name, rv)));
        }
        cache.apply(&watcher::Event::InitDone);
        let mut seen = Vec::new();
        cache.for_each(|obj| {
            seen.push((
                obj.metadata.name.unwrap(),
                obj.metadata.resource_version.unwrap(),
            ));
        });
        seen.sort();
        assert_eq!(
            seen,
            vec![
                ("a".to_string(), "1".to_string()),
                ("b".into(), "2".into()),
                ("c".into(), "3".into())
            ]
        );
        let mut keys = Vec::new();
        cache.for_each_key(|namespace, name| keys.push(format!("{namespace}/{name}")));
        keys.sort();
        assert_eq!(keys, ["ns/a", "ns/b", "ns/c"]);
    }

    #[test]
    fn a_relisting_replaces_the_contents() {
        let cache = Cache::<DynamicObject>::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("a", "1")));
        cache.apply(&watcher::Event::InitDone);
        // a re-list (watch expired): objects deleted meanwhile disappear at InitDone
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("b", "1")));
        assert!(cache.get("ns", "a").is_some());
        cache.apply(&watcher::Event::InitDone);
        assert_eq!(cache.get("ns", "a"), None);
        assert!(cache.get("ns", "b").is_some());
    }

    fn skipped(name: &str, deleted: bool) -> Skipped {
        Skipped {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            error: "spec.a.a: recursion limit exceeded".into(),
            deleted,
            passed_without_status: false,
        }
    }

    /// An object that turns undecodable is not "missing": it leaves the cache into the set of
    /// undecodable keys, and leaves that set when it decodes again or is deleted.
    #[test]
    fn an_undecodable_object_is_kept_apart_until_it_decodes_or_goes() {
        let cache = Cache::<DynamicObject>::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("a", "1")));
        cache.apply(&watcher::Event::InitApply(car("b", "1")));
        cache.apply(&watcher::Event::InitDone);
        // live: `a` turns undecodable; its last decoded version is handed back
        let previous = cache.skip(&skipped("a", false));
        assert_eq!(previous, Some(car("a", "1")));
        assert_eq!(cache.get("ns", "a"), None);
        assert_eq!(
            cache.undecodable("ns", "a").as_deref(),
            Some("spec.a.a: recursion limit exceeded")
        );
        assert_eq!(cache.undecodable("ns", "b"), None);
        assert_eq!(
            cache.undecodable_summary(),
            (1, Some("ns/a: spec.a.a: recursion limit exceeded".into()))
        );
        // a second event while undecodable: nothing to hand back
        assert_eq!(cache.skip(&skipped("a", false)), None);
        // it decodes again: out of the set, back in the cache
        assert!(cache.apply(&watcher::Event::Apply(car("a", "2"))));
        assert_eq!(cache.undecodable("ns", "a"), None);
        assert!(cache.get("ns", "a").is_some());
        assert!(!cache.apply(&watcher::Event::Apply(car("b", "2"))));
        // undecodable again, then deleted while undecodable
        cache.skip(&skipped("a", false));
        assert!(cache.undecodable("ns", "a").is_some());
        cache.skip(&skipped("a", true));
        assert_eq!(cache.undecodable("ns", "a"), None);
        assert_eq!(cache.get("ns", "a"), None);
        assert_eq!(cache.undecodable_summary(), (0, None));
    }

    /// A listing rebuilds the set: found undecodable in it, an object is in the set at
    /// `InitDone`; one no longer listed leaves it.
    #[test]
    fn a_listing_rebuilds_the_undecodable_set() {
        let cache = Cache::<DynamicObject>::new();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(car("a", "1")));
        assert_eq!(cache.skip(&skipped("deep", false)), None);
        // not before the listing is done
        assert_eq!(cache.undecodable("ns", "deep"), None);
        assert!(cache.apply(&watcher::Event::InitDone));
        assert!(cache.undecodable("ns", "deep").is_some());
        assert!(cache.get("ns", "a").is_some());
        // re-list: `deep` is gone, `a` is now undecodable (its cached version goes with the
        // listing's contents)
        cache.apply(&watcher::Event::Init);
        cache.skip(&skipped("a", false));
        assert!(cache.undecodable("ns", "deep").is_some(), "until InitDone");
        assert!(cache.apply(&watcher::Event::InitDone));
        assert_eq!(cache.undecodable("ns", "deep"), None);
        assert!(cache.undecodable("ns", "a").is_some());
        assert_eq!(cache.get("ns", "a"), None);
    }

    #[test]
    fn a_long_error_is_cut_at_a_character_boundary() {
        let long = format!(
            "{}: recursion limit exceeded",
            "é".repeat(MAX_UNDECODABLE_ERROR)
        );
        let cut = cut(&long, MAX_UNDECODABLE_ERROR);
        assert!(cut.len() <= MAX_UNDECODABLE_ERROR + '…'.len_utf8());
        assert!(cut.starts_with("éé") && cut.contains('…'), "{cut}");
        assert!(cut.ends_with(": recursion limit exceeded"), "{cut}");
        assert_eq!(super::cut("short", 10), "short");
    }
}
