//! What one synced object asks for ([`Wanted`]): from the caches and the claims, whether a host
//! object is copied, to which name, or why not; a refusal is reported once per object.

use kube::ResourceExt;
use kube::api::DynamicObject;
use vcp_crds::Reason;

use crate::driver::ObjectKey;
use crate::stats::Outcome;
use crate::translate::MANAGED_BY_LABEL;

use super::entry::Produced;
use super::index::Declared;
use super::names::{Claimant, ambiguous_host_name, claim, string_at};

/// What one synced object asks for.
pub(super) enum Wanted {
    /// Its host copy is not there yet: change nothing.
    Keep,
    /// No name, or no host object of that name: no copy.
    Nothing,
    /// The host name is not the host name of the virtual name (the message says why).
    Refused(String),
    /// The host name is declared by more than one place ([`claim`]): nothing is copied, and
    /// the copies already there are left as they are (no longer updated).
    Ambiguous(String),
    /// Copy this host object to this virtual name.
    Copy(String, Box<DynamicObject>),
}

impl Produced {
    /// The synced object `source` brings nothing back: one `ProducedNameRefused` Event per
    /// object, about it (the Event's related object, so that the refusals of two objects are
    /// two Events, not a repeat of the first), and the object counts as failed.
    pub(super) fn refused(&self, source: &DynamicObject, message: String) -> Outcome {
        let uid = source.uid().unwrap_or_default();
        let related = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(self.opts.source.api_version.clone()),
            kind: Some(self.opts.source.kind.clone()),
            namespace: source.namespace(),
            name: Some(source.name_any()),
            uid: source.uid(),
            ..Default::default()
        };
        self.opts.stats.warn_once_about(
            Some(related),
            &format!(
                "{uid} {} {}",
                Reason::ProducedNameRefused,
                self.opts.name_path
            ),
            Reason::ProducedNameRefused,
            message.clone(),
        );
        Outcome::Failed(message)
    }

    /// What the virtual object `obj` (the synced object `key`) declares, from its `namePath`.
    pub(super) fn declared(&self, obj: &DynamicObject, key: &ObjectKey) -> Option<Declared> {
        let name = string_at(&obj.data, &self.opts.name_path)?;
        Some((
            name.to_string(),
            self.opts.translator.host_name(name, &key.namespace),
        ))
    }

    pub(super) fn wanted(&self, key: &ObjectKey, source: &DynamicObject) -> Wanted {
        let translator = &self.opts.translator;
        let Some((virtual_name, expected)) = self.declared(source, key) else {
            return Wanted::Nothing;
        };
        let Some(host_copy) = self
            .host_sources
            .get(
                translator.host_namespace(),
                &translator.host_name(&key.name, &key.namespace),
            )
            .filter(|h| translator.is_host_copy_of(&h.metadata, &key.name, &key.namespace))
        else {
            return Wanted::Keep;
        };
        let Some(host_name) = string_at(&host_copy.data, &self.opts.name_path) else {
            return Wanted::Nothing;
        };
        if host_name != expected {
            return Wanted::Refused(format!(
                "{} {key}: {} {:?} of its host copy is not the host name of {:?} in namespace {} ({expected:?}); only objects named as a reference patch on {} names them are brought back, so {} {}/{host_name} is not copied",
                self.opts.source.kind,
                self.opts.name_path,
                host_name,
                virtual_name,
                key.namespace,
                self.opts.name_path,
                self.opts.produced.kind,
                translator.host_namespace(),
            ));
        }
        if let Some(why) = ambiguous_host_name(&virtual_name, &key.namespace, translator.vcluster())
        {
            // as for a name two places declare: what looks like a copy made for it is left as
            // it is (its marks may be a virtual user's, on an object of their own)
            return Wanted::Ambiguous(format!(
                "{} {key}: {} {}/{host_name} is not copied: {why}",
                self.opts.source.kind,
                self.opts.produced.kind,
                translator.host_namespace(),
            ));
        }
        if let Err(message) = self.claim(key, &virtual_name, &expected) {
            return Wanted::Ambiguous(message);
        }
        match self
            .host_produced
            .get(translator.host_namespace(), host_name)
            .filter(|h| {
                h.metadata.deletion_timestamp.is_none()
                    && !h.labels().contains_key(MANAGED_BY_LABEL)
            }) {
            Some(host) => Wanted::Copy(virtual_name, Box::new(host)),
            None => Wanted::Nothing,
        }
    }

    /// Whether the synced object `key` may bring back the host object `host_name` as
    /// `virtual_name` in its namespace ([`claim`] over what the index knows of the other
    /// synced objects that declare the same host name).
    fn claim(&self, key: &ObjectKey, virtual_name: &str, host_name: &str) -> Result<(), String> {
        let Ok(index) = self.index.lock() else {
            return Ok(());
        };
        let holds =
            |k: &ObjectKey, name: &str| index.copies.get(k).is_some_and(|c| c.contains(name));
        let others: Vec<Claimant> = index
            .by_host_name
            .get(host_name)
            .into_iter()
            .flatten()
            .filter(|k| *k != key)
            .filter_map(|k| {
                let (name, _) = index.declared.get(k)?;
                Some(Claimant {
                    key: k.clone(),
                    virtual_name: name.clone(),
                    holds_copy: holds(k, name),
                    kind: self.opts.source.kind.clone(),
                })
            })
            .chain(
                self.opts
                    .claims
                    .others(&self.produced_kind, host_name, &self.entry)
                    .into_iter()
                    .map(|(kind, key, virtual_name)| Claimant {
                        key,
                        virtual_name,
                        holds_copy: false,
                        kind,
                    }),
            )
            .collect();
        claim(
            &Claimant {
                key: key.clone(),
                virtual_name: virtual_name.to_string(),
                holds_copy: holds(key, virtual_name),
                kind: self.opts.source.kind.clone(),
            },
            &others,
            host_name,
            &self.opts.source.kind,
            &self.opts.produced.kind,
        )
    }
}
