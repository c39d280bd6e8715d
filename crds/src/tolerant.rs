//! Tolerant reading: one object that cannot be decoded fails alone; the others are read,
//! listed and watched as if it were not there.
//!
//! kube's watcher decodes a list response as one `ObjectList<K>` and each watch line as one
//! `WatchEvent<K>`. With a plain `K`, a single object our types cannot read (a condition whose
//! `lastTransitionTime` the API server's `date-time` check accepted but `k8s_openapi`'s `Time`
//! refuses, a free-form field nested deeper than serde_json's recursion limit of 128) fails the
//! whole list, and the watch of every other object of that type stops with it.
//!
//! [`Tolerant<K>`] decodes in two steps instead: the item as raw JSON text
//! ([`serde_json::value::RawValue`], which serde_json skips over without a recursion limit),
//! then that text alone as `K`. The second step's failure is that object's only:
//! - `K` fails but `K` without its `status` decodes: [`Tolerant::WithoutStatus`] (a status is
//!   written by controllers, and a reader that only needs the spec goes on);
//! - otherwise [`Tolerant::Undecodable`], with the object's identity (read from `metadata`
//!   alone, skipping the rest without a depth limit) and the error with its JSON path
//!   (`status.conditions[1].lastTransitionTime: ...`).
//!
//! [`watcher`] wraps kube's watcher over `Api<Tolerant<K>>` and yields plain `K` events, telling
//! a callback of every object it could not pass on ([`Skipped`]).
//!
//! Only serde_json's text deserializers carry raw values: kube's client decodes lists and watch
//! lines with `serde_json::from_str`, and so must tests; `serde_json::from_value` refuses
//! a `Tolerant<K>`.

use std::borrow::Cow;
use std::fmt::Debug;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher as kube_watcher;
use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

/// One listed or watched object, decoded as far as it goes (module docs).
// Transient: each one is turned into a `K` (or a `Skipped`) as it arrives, never stored, so the
// size of its variants matters little.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Tolerant<K> {
    /// The whole object decoded as `K`.
    Whole(K),
    /// `K` without its `status`: the object did not decode as `K`, but its other fields did.
    WithoutStatus {
        /// The object, its `status` left at `K`'s default for an absent field.
        object: K,
        /// Why the whole object did not decode (path and serde's message).
        error: String,
    },
    /// Not even without its status: only its identity is known.
    Undecodable(Undecodable),
}

/// An object that did not decode: its identity and why.
#[derive(Clone, Debug, Default)]
pub struct Undecodable {
    /// `name`, `namespace`, `uid`, `resourceVersion` and `generation` of the object, when they
    /// were readable (every other field of `metadata` is left out).
    pub metadata: ObjectMeta,
    /// The decoding error of the whole object, with its JSON path, such as
    /// `spec.values.a.a...: recursion limit exceeded` or
    /// `status.conditions[1].lastTransitionTime: ...`.
    pub error: String,
}

/// The identity of an object, read without decoding anything else (`metadata`'s other fields
/// and the object's other members are skipped by serde_json without a depth limit).
#[derive(Deserialize, Default)]
struct Head {
    #[serde(default)]
    metadata: Option<HeadMeta>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
}

/// Decodes one object's JSON text as `K`, as far as it goes (module docs).
pub fn decode<K: DeserializeOwned>(text: &str) -> Tolerant<K> {
    let whole = {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize::<_, K>(&mut de).map_err(|e| describe(&e))
    };
    let error = match whole {
        Ok(object) => return Tolerant::Whole(object),
        Err(error) => error,
    };
    if let Some(object) = without_status::<K>(text) {
        return Tolerant::WithoutStatus { object, error };
    }
    let head: Head = serde_json::from_str(text).unwrap_or_default();
    let head = head.metadata.unwrap_or_default();
    Tolerant::Undecodable(Undecodable {
        metadata: ObjectMeta {
            name: head.name,
            namespace: head.namespace,
            uid: head.uid,
            resource_version: head.resource_version,
            generation: head.generation,
            ..ObjectMeta::default()
        },
        error,
    })
}

/// `K` from `text` with its top-level `status` member left out, if it has one and the rest
/// decodes.
fn without_status<K: DeserializeOwned>(text: &str) -> Option<K> {
    let mut members: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    let raw: std::collections::BTreeMap<String, Box<RawValue>> = serde_json::from_str(text).ok()?;
    if !raw.contains_key("status") {
        return None;
    }
    // Each remaining member decoded alone: a member deeper than the recursion limit fails
    // here, and the object is undecodable.
    for (key, value) in raw {
        if key != "status" {
            members.insert(key, serde_json::from_str(value.get()).ok()?);
        }
    }
    serde_json::from_value(serde_json::Value::Object(members)).ok()
}

/// `path: message`, or the message alone for an error at the root.
fn describe(error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = error.path().to_string();
    // serde_json's own position refers to this one object's text, not to the list: drop it.
    let inner = error.inner();
    let message = match inner.line() {
        0 => inner.to_string(),
        _ => {
            let text = inner.to_string();
            match text.rfind(" at line ") {
                Some(at) => text[..at].to_string(),
                None => text,
            }
        }
    };
    if path == "." || path.is_empty() {
        message
    } else {
        format!("{path}: {message}")
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Tolerant<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Ok(decode(raw.get()))
    }
}

impl<K: Serialize> Serialize for Tolerant<K> {
    /// The decoded object; an undecodable one as its identity only.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Tolerant::Whole(object) | Tolerant::WithoutStatus { object, .. } => {
                object.serialize(serializer)
            }
            Tolerant::Undecodable(u) => {
                #[derive(Serialize)]
                struct Identity<'a> {
                    metadata: &'a ObjectMeta,
                }
                Identity {
                    metadata: &u.metadata,
                }
                .serialize(serializer)
            }
        }
    }
}

impl<K: Resource> Resource for Tolerant<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    /// As `K`'s: a `K` that is read as metadata only (such as kube's `PartialObjectMeta`) is
    /// listed and watched as `PartialObjectMetadata` through `Tolerant<K>` too.
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Tolerant::Whole(object) | Tolerant::WithoutStatus { object, .. } => object.meta(),
            Tolerant::Undecodable(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Tolerant::Whole(object) | Tolerant::WithoutStatus { object, .. } => object.meta_mut(),
            Tolerant::Undecodable(u) => &mut u.metadata,
        }
    }
}

/// What [`watcher`] does with an object that decoded only without its status
/// ([`Tolerant::WithoutStatus`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusPolicy {
    /// Pass the object on without its status (a reader that does not read the status, such as
    /// the operator's and the runtime's readers of `VClusterPlugin`s, whose status they write).
    PassWithout,
    /// Skip it like an undecodable object (a reader that copies or compares the status).
    Skip,
}

/// An object [`watcher`] could not pass on whole, or passed on without its status.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// The object's identity (module docs of [`Undecodable`]).
    pub metadata: ObjectMeta,
    /// Why: the decoding error with its JSON path.
    pub error: String,
    /// Whether it came as a delete event (the object is gone).
    pub deleted: bool,
    /// Whether the object was passed on all the same, without its status
    /// ([`StatusPolicy::PassWithout`]).
    pub passed_without_status: bool,
}

/// kube's watcher over `api`, yielding the objects that decode (module docs).
///
/// `skipped` is told of every object not passed on whole, before the next event is yielded:
/// on an object that turns undecodable, it is told before anything else happens to that
/// object. `ghost` is asked for the `K` to send as a delete event in place of an object that
/// turned undecodable, or was deleted while undecodable, so that a cache drops its last
/// decoded version (`None`: nothing sent, as for an object no cache holds).
///
/// Errors are kube's watcher errors (a list or watch request that failed as a whole); no
/// object's content can cause one.
pub fn watcher<K>(
    api: Api<Tolerant<K>>,
    config: kube_watcher::Config,
    status: StatusPolicy,
    mut skipped: impl FnMut(&Skipped) + Send + 'static,
    mut ghost: impl FnMut(&ObjectMeta) -> Option<K> + Send + 'static,
) -> impl Stream<Item = Result<kube_watcher::Event<K>, kube_watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    kube_watcher::watcher(api, config).filter_map(move |event| {
        let event = match event {
            Err(error) => Some(Err(error)),
            Ok(event) => pass(event, status, &mut skipped, &mut ghost).map(Ok),
        };
        futures::future::ready(event)
    })
}

/// One event of the raw watch as the event to pass on, if any ([`watcher`]).
fn pass<K: Resource>(
    event: kube_watcher::Event<Tolerant<K>>,
    status: StatusPolicy,
    skipped: &mut impl FnMut(&Skipped),
    ghost: &mut impl FnMut(&ObjectMeta) -> Option<K>,
) -> Option<kube_watcher::Event<K>> {
    use kube_watcher::Event;
    let (object, deleted, init) = match event {
        Event::Init => return Some(Event::Init),
        Event::InitDone => return Some(Event::InitDone),
        Event::Apply(object) => (object, false, false),
        Event::InitApply(object) => (object, false, true),
        Event::Delete(object) => (object, true, false),
    };
    let wrap = |object: K| {
        Some(if deleted {
            Event::Delete(object)
        } else if init {
            Event::InitApply(object)
        } else {
            Event::Apply(object)
        })
    };
    match object {
        Tolerant::Whole(object) => wrap(object),
        Tolerant::WithoutStatus { object, error } => {
            let pass = status == StatusPolicy::PassWithout;
            skipped(&Skipped {
                metadata: identity(object.meta()),
                error,
                deleted,
                passed_without_status: pass,
            });
            if pass {
                wrap(object)
            } else if init {
                // a list in progress: the cache is rebuilt from what is passed on
                None
            } else {
                ghost(&identity(object.meta())).map(Event::Delete)
            }
        }
        Tolerant::Undecodable(u) => {
            skipped(&Skipped {
                metadata: u.metadata.clone(),
                error: u.error,
                deleted,
                passed_without_status: false,
            });
            if init {
                None
            } else {
                ghost(&u.metadata).map(Event::Delete)
            }
        }
    }
}

/// The identity fields of `meta` ([`Undecodable::metadata`]).
fn identity(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        generation: meta.generation,
        ..ObjectMeta::default()
    }
}

/// `namespace/name` (or `name` for a cluster-scoped object) of `meta`, for logs and statuses.
pub fn key_of(meta: &ObjectMeta) -> String {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.clone(),
        (_, None) => "<unnamed>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VClusterPlugin;
    use kube::api::ObjectList;

    const GOOD: &str = r#"{"apiVersion":"vcp.dev/v1alpha1","kind":"VClusterPlugin",
        "metadata":{"name":"good","namespace":"team-b","uid":"u-good","resourceVersion":"7"},
        "spec":{"vcluster":{"name":"vc"}}}"#;

    fn poisoned_status() -> String {
        // a value the API server's date-time check accepts and k8s_openapi's `Time` refuses
        r#"{"apiVersion":"vcp.dev/v1alpha1","kind":"VClusterPlugin",
        "metadata":{"name":"bad","namespace":"team-a","uid":"u-bad","resourceVersion":"8","generation":3},
        "spec":{"vcluster":{"name":"vc"}},
        "status":{"conditions":[{"type":"Evil","status":"True","reason":"X","message":"x",
            "lastTransitionTime":"2024-01-01T10:00:00Zt"}]}}"#
            .to_string()
    }

    /// An object whose `spec.config` nests `depth` arrays.
    fn deep(depth: usize) -> String {
        format!(
            r#"{{"apiVersion":"vcp.dev/v1alpha1","kind":"VClusterPlugin",
            "metadata":{{"name":"deep","namespace":"team-a","uid":"u-deep"}},
            "spec":{{"vcluster":{{"name":"vc"}},"config":{}{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    }

    #[test]
    fn a_list_with_a_poisoned_status_still_decodes_every_item() {
        // the same list fails whole with the plain type: that is the hole
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[{GOOD},{}]}}"#,
            poisoned_status()
        );
        assert!(serde_json::from_str::<ObjectList<VClusterPlugin>>(&list).is_err());
        let list: ObjectList<Tolerant<VClusterPlugin>> = serde_json::from_str(&list).unwrap();
        assert!(
            matches!(&list.items[0], Tolerant::Whole(p) if p.metadata.name.as_deref() == Some("good"))
        );
        let Tolerant::WithoutStatus { object, error } = &list.items[1] else {
            panic!(
                "expected the poisoned plugin without its status: {:?}",
                list.items[1]
            );
        };
        assert_eq!(object.metadata.name.as_deref(), Some("bad"));
        assert!(object.status.is_none());
        assert!(
            error.starts_with("status.conditions[0].lastTransitionTime: "),
            "{error}"
        );
    }

    #[test]
    fn an_object_deeper_than_serde_json_s_limit_fails_alone_with_its_identity() {
        // 128 is serde_json's recursion limit; the list and the object add their own levels
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[{},{GOOD}]}}"#,
            deep(140)
        );
        let error = serde_json::from_str::<ObjectList<VClusterPlugin>>(&list).unwrap_err();
        assert!(
            error.to_string().contains("recursion limit exceeded"),
            "{error}"
        );
        let list: ObjectList<Tolerant<VClusterPlugin>> = serde_json::from_str(&list).unwrap();
        let Tolerant::Undecodable(u) = &list.items[0] else {
            panic!("expected undecodable: {:?}", list.items[0]);
        };
        assert_eq!(key_of(&u.metadata), "team-a/deep");
        assert_eq!(u.metadata.uid.as_deref(), Some("u-deep"));
        assert!(u.error.contains("recursion limit exceeded"), "{}", u.error);
        assert!(u.error.starts_with("spec.config"), "{}", u.error);
        assert!(matches!(&list.items[1], Tolerant::Whole(_)));
        // a depth within the limit decodes whole
        assert!(matches!(
            decode::<VClusterPlugin>(&deep(100)),
            Tolerant::Whole(_)
        ));
    }

    #[test]
    fn a_watch_line_of_a_poisoned_object_decodes() {
        let line = format!(r#"{{"type":"MODIFIED","object":{}}}"#, deep(200));
        let event: kube::core::WatchEvent<Tolerant<VClusterPlugin>> =
            serde_json::from_str(&line).unwrap();
        let kube::core::WatchEvent::Modified(Tolerant::Undecodable(u)) = event else {
            panic!("expected an undecodable modified object");
        };
        assert_eq!(u.metadata.name.as_deref(), Some("deep"));
    }

    #[test]
    fn pass_tells_the_callback_and_asks_for_a_ghost_on_a_live_event_only() {
        use kube_watcher::Event;
        let mut told = Vec::new();
        let mut ghosts = Vec::new();
        let bad = || decode::<VClusterPlugin>(&deep(140));
        // during a list: no ghost (the cache is rebuilt from what is passed on)
        let out = pass(
            Event::InitApply(bad()),
            StatusPolicy::PassWithout,
            &mut |s: &Skipped| told.push(s.clone()),
            &mut |m: &ObjectMeta| {
                ghosts.push(key_of(m));
                None
            },
        );
        assert!(out.is_none());
        assert!(ghosts.is_empty());
        // a live modification that made it undecodable: the ghost is sent as a delete
        let good: VClusterPlugin = serde_json::from_str(GOOD).unwrap();
        let out = pass(
            Event::Apply(bad()),
            StatusPolicy::PassWithout,
            &mut |s: &Skipped| told.push(s.clone()),
            &mut |m: &ObjectMeta| {
                ghosts.push(key_of(m));
                Some(good.clone())
            },
        );
        assert!(matches!(out, Some(Event::Delete(_))));
        assert_eq!(ghosts, ["team-a/deep"]);
        assert_eq!(told.len(), 2);
        assert!(told.iter().all(|s| !s.passed_without_status && !s.deleted));
        // a poisoned status under Skip is skipped; under PassWithout it is passed on
        let poisoned = || decode::<VClusterPlugin>(&poisoned_status());
        let out = pass(
            Event::Apply(poisoned()),
            StatusPolicy::Skip,
            &mut |s: &Skipped| told.push(s.clone()),
            &mut |_: &ObjectMeta| None,
        );
        assert!(out.is_none());
        let out = pass(
            Event::Apply(poisoned()),
            StatusPolicy::PassWithout,
            &mut |s: &Skipped| told.push(s.clone()),
            &mut |_: &ObjectMeta| None,
        );
        assert!(matches!(out, Some(Event::Apply(p)) if p.status.is_none()));
        assert!(told[3].passed_without_status);
    }
}
