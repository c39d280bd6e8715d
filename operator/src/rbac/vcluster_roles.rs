//! `rbac.mode: PatchVClusterRoles`: the plugin's namespaced rules appended to the vCluster's
//! own Role, recorded so that removal restores the Role byte for byte.
//!
//! The rule (`rbac.mode: PatchVClusterRoles`): append the rules to the Roles bound to that
//! service account, recording exactly what was added so that removal restores the Role byte
//! for byte.
//! The Role is found through the RoleBindings of the namespace with RBAC's subject semantics
//! (a ServiceAccount subject without a namespace is in the binding's namespace); a Role also
//! bound to another subject is refused, as the rules would widen that subject too. Why a merge
//! patch with a `resourceVersion` precondition rather than server-side apply: see the
//! [`rbac`](super) module.
//!
//! A plugin never appends a rule the Role already grants outside its own record (security
//! review, finding 4). Recording an appended copy of a rule the chart's Role already held made
//! the two interchangeable: once Helm re-applied the chart (`rules` back to the chart's list,
//! one copy left), the record still looked held, and the plugin's removal then took out the
//! chart's own rule, against the rule that nothing a user made is ever lost or overwritten by
//! the operator. So the record ([`Record`]) keeps two lists: `added`, the entries the plugin
//! appended (removal takes out one equal entry each, [`without_recorded`]), and `present`, the
//! rules it needs that the Role already held outside its record, whether the chart's, a user's
//! or another plugin's `added` ones (never appended, never removed). A record is held
//! ([`records_held`]) when its `added` rules are still held and every `present` rule is still
//! in the Role; so when the plugin that appended a rule goes, another plugin that recorded it as
//! `present` sees its record unheld, and its reconcile appends the rule again. A record written
//! before this rule (a JSON list: `added` only) that holds a rule twice, the chart's copy and
//! its own, converges to one copy recorded as `present`.
//!
//! Left as it is: a chart upgrade that later adds exactly a rule the plugin appended makes the
//! two one entry (Helm replaces the whole atomic `rules` list), which the record then counts as
//! the plugin's: its removal takes that rule out. The same holds for a record written before
//! this rule whose appended copy Helm had already merged with the chart's: nothing in the Role
//! tells the two apart.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, Subject};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use vcp_crds::PLUGIN_NAME_LABEL;

use super::objects::{RBAC_GROUP, service_account_name};
use super::rules::normalize;

/// Prefix of the annotations recording the rules a plugin appended to a vCluster Role (every
/// scheme: [`added_rules_annotation`], [`legacy_added_rules_annotation`]).
pub const ADDED_RULES_PREFIX: &str = "vcp.dev/added-rules.";

/// The longest plugin name the key [`added_rules_annotation`] holds as it is: an annotation
/// key's name part (after `vcp.dev/`) is at most 63 characters, `added-rules.` takes 12.
pub const ADDED_RULES_MAX_NAME: usize = 63 - "added-rules.".len();

/// Marks the hashed form of [`added_rules_annotation`]: a plugin name is a DNS-1123 label (the
/// CRD's rule), which never contains `.`, so no name form can equal a hashed form.
const HASHED_MARK: &str = "sha256.";

/// The annotation on a vCluster Role holding the [`Record`] of `plugin_name` (JSON).
///
/// Injective over plugin names (the earlier scheme cut a long name to 40 characters plus 10
/// hex digits of FNV-1a, which a 51-character name could equal):
/// - a name of at most [`ADDED_RULES_MAX_NAME`] (51) characters: `vcp.dev/added-rules.<name>`
///   (unchanged from the earlier scheme, so nothing recorded for such a name needs migrating);
/// - a longer one (52 to 63 characters, the CRD's limit): `vcp.dev/added-rules.sha256.<h>`,
///   `<h>` the full SHA-256 of the name in unpadded base64url (43 characters; the name part is
///   then 62 characters; its last character encodes 4 bits padded with 2 zero bits, so it is
///   alphanumeric as a key requires). The `.` keeps the two forms apart (see `HASHED_MARK`).
///
/// Records under the earlier key of a long name ([`legacy_added_rules_annotation`]) are found
/// and migrated by [`patch_role`] and removed by the sweep (`crate::sweep`).
pub fn added_rules_annotation(plugin_name: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    if plugin_name.len() <= ADDED_RULES_MAX_NAME {
        return format!("{ADDED_RULES_PREFIX}{plugin_name}");
    }
    let hash = sha2::Sha256::digest(plugin_name.as_bytes());
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hash);
    format!("{ADDED_RULES_PREFIX}{HASHED_MARK}{encoded}")
}

/// The key the operator used before the injective one for a plugin name longer than
/// [`ADDED_RULES_MAX_NAME`]: `vcp.dev/added-rules.<first 40 characters>-<10 hex digits of the
/// name's 64-bit FNV-1a hash>`; `None` for a shorter name (its key did not change). Read only,
/// to migrate and sweep records written by an older operator: it is not injective (a
/// 51-character name equals it).
pub fn legacy_added_rules_annotation(plugin_name: &str) -> Option<String> {
    if plugin_name.len() <= ADDED_RULES_MAX_NAME {
        return None;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in plugin_name.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let hex = format!("{hash:016x}");
    let cut = plugin_name.get(..40).unwrap_or(plugin_name);
    Some(format!("{ADDED_RULES_PREFIX}{cut}-{}", &hex[..10]))
}

/// Every key under which `plugin_name` may have recorded rules: [`added_rules_annotation`],
/// then [`legacy_added_rules_annotation`] when there is one and it is not the current key of
/// one of `others` (the other plugins of the namespace: a 51-character name can equal a long
/// name's earlier key, and the record under it is then the existing plugin's to keep).
pub fn record_keys(plugin_name: &str, others: &[String]) -> Vec<String> {
    let mut keys = vec![added_rules_annotation(plugin_name)];
    keys.extend(
        legacy_added_rules_annotation(plugin_name)
            .filter(|l| !others.iter().any(|o| &added_rules_annotation(o) == l)),
    );
    keys
}

/// The Role a `PatchVClusterRoles` plugin appends to: among the Roles that RoleBindings of the
/// namespace bind to the vCluster's service account `service_account` (and that are not a
/// plugin's dedicated Role, labelled [`PLUGIN_NAME_LABEL`]), the one named `vc-<vcluster>`
/// (the vCluster chart's) when bound, else the first by name. `None` when no Role is bound.
pub fn target_role(
    bindings: &[RoleBinding],
    namespace: &str,
    vcluster: &str,
    service_account: &str,
) -> Option<String> {
    let chart_role = service_account_name(vcluster);
    let sa = service_account;
    let mut roles: Vec<String> = bindings
        .iter()
        .filter(|b| b.role_ref.kind == "Role" && b.role_ref.api_group == RBAC_GROUP)
        .filter(|b| b.labels().get(PLUGIN_NAME_LABEL).is_none())
        .filter(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| is_service_account(s, namespace, sa))
        })
        .map(|b| b.role_ref.name.clone())
        .collect();
    roles.sort();
    roles.dedup();
    if roles.contains(&chart_role) {
        return Some(chart_role);
    }
    roles.into_iter().next()
}

/// Whether `subject` (of a RoleBinding in `namespace`) is the ServiceAccount `service_account`
/// of `namespace` (RBAC semantics: a ServiceAccount subject without a namespace is in the
/// binding's namespace).
fn is_service_account(subject: &Subject, namespace: &str, service_account: &str) -> bool {
    subject.kind == "ServiceAccount"
        && subject.name == service_account
        && subject.namespace.as_deref().unwrap_or(namespace) == namespace
}

/// The subjects, other than the ServiceAccount `service_account` of `namespace`, that any
/// RoleBinding of `namespace` binds the Role `role` to, each as `<kind> <name>` (with
/// `<namespace>/` for a ServiceAccount), sorted and deduplicated. Not empty means appending to
/// the Role (`rbac.mode: PatchVClusterRoles`) would grant the plugin's rules to them as well:
/// users, groups (even one the service account belongs to, such as
/// `system:serviceaccounts:<namespace>`) and other service accounts.
pub fn other_subjects(
    bindings: &[RoleBinding],
    namespace: &str,
    role: &str,
    service_account: &str,
) -> Vec<String> {
    let mut out: Vec<String> = bindings
        .iter()
        .filter(|b| {
            b.role_ref.kind == "Role"
                && b.role_ref.api_group == RBAC_GROUP
                && b.role_ref.name == role
        })
        .flat_map(|b| b.subjects.iter().flatten())
        .filter(|s| !is_service_account(s, namespace, service_account))
        .map(|s| match s.kind.as_str() {
            "ServiceAccount" => format!(
                "ServiceAccount {}/{}",
                s.namespace.as_deref().unwrap_or(namespace),
                s.name
            ),
            kind => format!("{kind} {}", s.name),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What a plugin recorded in a vCluster Role (module docs), the JSON of the annotation
/// [`added_rules_annotation`]: `{"added": [rules], "present": [rules]}`, each rule normalized
/// ([`normalize`]) and each once. A record an operator wrote before `present` existed is a
/// JSON list of rules, read as `added` ([`Record::parse`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The entries the plugin appended to the Role: its removal takes out one equal entry each.
    #[serde(default)]
    pub added: Vec<PolicyRule>,
    /// The rules the plugin needs that the Role already held outside its record when it was
    /// patched: never appended, never removed; the record is held only while each is in the
    /// Role ([`records_held`]).
    #[serde(default)]
    pub present: Vec<PolicyRule>,
}

impl Record {
    /// The record in an annotation's value: the object form, or the earlier JSON list of rules
    /// (as `added`, `present` empty). `None` when it is neither.
    pub fn parse(value: &str) -> Option<Self> {
        // The list first: serde would also read a list as the struct's fields in order.
        match serde_json::from_str::<Vec<PolicyRule>>(value) {
            Ok(added) => Some(Self {
                added,
                present: Vec::new(),
            }),
            Err(_) => serde_json::from_str::<Self>(value).ok(),
        }
    }

    /// Whether it records nothing (then no annotation is written).
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.present.is_empty()
    }

    /// Whether `rules` holds it, as the operator leaves a Role: each `added` rule takes one
    /// equal entry of its own out of `rules` ([`without_recorded`]: two records of the same
    /// appended rule share one entry), and every `present` rule is in `rules`.
    fn held_by(&self, rules: &[PolicyRule]) -> bool {
        without_recorded(rules, &self.added).len() + self.added.len() == rules.len()
            && self.present.iter().all(|p| grants(rules, p))
    }
}

/// Whether `rules` has an entry equal to `rule` (both normalized).
fn grants(rules: &[PolicyRule], rule: &PolicyRule) -> bool {
    let rule = normalize(rule);
    rules.iter().any(|r| normalize(r) == rule)
}

/// The [`Record`] of `plugin_name` in `role`, under each of its [`record_keys`] (`others`: the
/// other plugins of the namespace; empty when none or unreadable).
pub fn recorded_rules(role: &Role, plugin_name: &str, others: &[String]) -> Record {
    rules_under(role, &record_keys(plugin_name, others))
}

/// The records in `role` under the annotations `keys`, as one [`Record`]: their `added` lists
/// one after the other in that order, and their `present` lists so (an unreadable record counts
/// as none).
pub fn rules_under(role: &Role, keys: &[String]) -> Record {
    let mut all = Record::default();
    for record in keys
        .iter()
        .filter_map(|k| role.annotations().get(k))
        .filter_map(|v| Record::parse(v))
    {
        all.added.extend(record.added);
        all.present.extend(record.present);
    }
    all
}

/// `rules` without the `recorded` entries: for each recorded rule, from the last, its last
/// occurrence is removed (equal rules are interchangeable, so this restores the list exactly
/// even when another plugin appended the same rule later).
pub fn without_recorded(rules: &[PolicyRule], recorded: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = rules.to_vec();
    for r in recorded.iter().rev() {
        let r = normalize(r);
        if let Some(i) = out.iter().rposition(|x| normalize(x) == r) {
            out.remove(i);
        }
    }
    out
}

/// The record of `desired` (normalized, each once) against `base`, the Role's rules without
/// the plugin's own appended entries: a rule `base` already holds is `present`, the others are
/// `added` (module docs).
fn record_of(base: &[PolicyRule], desired: &[PolicyRule]) -> Record {
    let mut record = Record::default();
    for rule in desired.iter().map(normalize) {
        if record.added.contains(&rule) || record.present.contains(&rule) {
            continue;
        }
        if grants(base, &rule) {
            record.present.push(rule);
        } else {
            record.added.push(rule);
        }
    }
    record
}

/// The JSON merge patch (RFC 7386) that makes `live` grant `desired` for `plugin_name`,
/// appending those it does not hold yet (`None`: remove what it appended), or `None` when
/// `live` already does.
///
/// The patch carries `metadata.resourceVersion` of `live` (the API server refuses it with 409
/// Conflict when the Role changed since: optimistic concurrency), the whole new `rules` (the
/// live list minus the recorded `added` entries plus the desired rules that list lacks; a merge
/// patch replaces a list whole) and the annotation [`added_rules_annotation`] (the [`Record`],
/// or `null` to remove it). A record under
/// the plugin's earlier key ([`legacy_added_rules_annotation`]) is taken out with it, so an
/// upgraded operator moves it to the new key, unless that key is the current key of one of
/// `others`, the other plugins of the namespace ([`record_keys`]).
pub fn patch_role(
    live: &Role,
    plugin_name: &str,
    others: &[String],
    desired: Option<&[PolicyRule]>,
) -> Option<Value> {
    let key = added_rules_annotation(plugin_name);
    patch_records(
        live,
        &record_keys(plugin_name, others),
        desired.map(|d| (key.as_str(), d)),
    )
}

/// The JSON merge patch that takes the rules recorded as `added` under each annotation of
/// `remove` out of `live` with those annotations, and, with `set: Some((key, rules))`, records
/// `rules` under `key` (module docs): `base` is `live`'s rules without those `added` entries;
/// the rules (normalized, each once) that `base` lacks are appended and recorded as `added`,
/// the others recorded as `present` (nothing recorded when `rules` is empty). `None` when
/// `live` already is so. Shape and concurrency as [`patch_role`], which this generalizes; the
/// sweep (`crate::sweep`) removes the records of plugins that no longer exist with it.
pub fn patch_records(
    live: &Role,
    remove: &[String],
    set: Option<(&str, &[PolicyRule])>,
) -> Option<Value> {
    let annotations = live.annotations();
    let mut remove: Vec<String> = remove.to_vec();
    if let Some((key, _)) = set
        && !remove.iter().any(|k| k == key)
    {
        remove.push(key.to_string());
    }
    let recorded = rules_under(live, &remove);
    let live_rules = live.rules.clone().unwrap_or_default();
    let base = without_recorded(&live_rules, &recorded.added);
    let (set_key, record) = match set {
        Some((key, rules)) => (Some(key), record_of(&base, rules)),
        None => (None, Record::default()),
    };

    let mut rules = base;
    rules.extend(record.added.iter().cloned());
    let mut changes = serde_json::Map::new();
    for k in &remove {
        let want = match set_key {
            Some(s) if s == k && !record.is_empty() => {
                Some(serde_json::to_string(&record).unwrap_or_default())
            }
            _ => None,
        };
        if annotations.get(k) != want.as_ref() {
            changes.insert(k.clone(), want.map_or(Value::Null, Value::String));
        }
    }
    // Converged: the record is as desired (no annotation changes) and the Role still holds it
    // (`added` wherever: another plugin may have appended after this one, and moving this one's
    // rules to the end on every reconcile would write the Role each time).
    if changes.is_empty() && (rules == live_rules || record.held_by(&live_rules)) {
        return None;
    }
    let mut metadata = json!({ "resourceVersion": live.metadata.resource_version });
    if !changes.is_empty() {
        metadata["annotations"] = Value::Object(changes);
    }
    Some(json!({ "metadata": metadata, "rules": rules }))
}

/// The patch restoring `live` to what it was before `plugin_name` appended to it; `None` when
/// it carries nothing of the plugin.
pub fn restore_role(live: &Role, plugin_name: &str, others: &[String]) -> Option<Value> {
    patch_role(live, plugin_name, others, None)
}

/// Whether `role` is as the operator leaves it for every record of its `vcp.dev/added-rules.*`
/// annotations ([`ADDED_RULES_PREFIX`], any plugin's, any key scheme): `None` when it carries
/// no record; `Some(false)` when a record's `added` rule is missing from `rules` (someone took
/// it out: `kubectl edit`, an apply by another field manager that owns `rules` now), a
/// record's `present` rule is (the chart's upgrade, or the plugin that appended it, took it
/// out), or a record is neither a [`Record`] nor the earlier JSON list of rules.
///
/// Each record is judged on its own, as [`patch_records`] judges a plugin's "converged" (each
/// `added` rule takes one equal entry out of the live list, [`without_recorded`]; each
/// `present` rule must be in it), so this is `Some(false)` exactly when the reconcile of some
/// plugin recorded here would write the Role back. (Two records of the same appended rule
/// share one entry for this judgement, as records written before `present` existed may: one
/// copy taken out leaves the rule granted, and the restore of the first plugin to go leaves the
/// other's record unheld, which is then repaired.)
pub fn records_held(role: &Role) -> Option<bool> {
    let keys: Vec<&String> = role
        .annotations()
        .keys()
        .filter(|k| k.starts_with(ADDED_RULES_PREFIX))
        .collect();
    if keys.is_empty() {
        return None;
    }
    let live = role.rules.clone().unwrap_or_default();
    Some(keys.iter().all(|k| {
        Record::parse(&role.annotations()[*k]).is_some_and(|record| record.held_by(&live))
    }))
}
