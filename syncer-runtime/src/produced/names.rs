//! The pure rules on names: the mark of a copy ([`produced_for`]), the name a synced object
//! declares ([`string_at`]), and which place may bring back a host name ([`claim`],
//! [`ambiguous_host_name`]).

use serde_json::Value;

use crate::driver::ObjectKey;
#[cfg(doc)]
use crate::translate::PRODUCED_FOR_ANNOTATION;

/// The value of [`PRODUCED_FOR_ANNOTATION`] for the synced object `name` of `api_version` /
/// `kind`: `<Kind>.<group>/<name>`, or `<Kind>/<name>` for the core group (kubectl's spelling
/// of a resource of a group, such as `Certificate.cert-manager.io/web`).
pub fn produced_for(api_version: &str, kind: &str, name: &str) -> String {
    match api_version.rsplit_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The non-empty string at `path` (vCluster's patch notation: dots, brackets, `[*]`, parsed by
/// [`vcp_crds::patch_path::PatchPath`]; the first match) in `data` (an object's top-level
/// fields but `metadata`). `None` when the path does not parse (the operator refuses such a
/// plugin), is not found, or holds no string.
pub(super) fn string_at<'a>(data: &'a Value, path: &str) -> Option<&'a str> {
    vcp_crds::patch_path::PatchPath::parse(path)
        .ok()?
        .get(data)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// A synced object that declares a host name: its key, the virtual name it declares, and whether
/// a copy of the host object is already there under that name for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Claimant {
    pub(super) key: ObjectKey,
    pub(super) virtual_name: String,
    pub(super) holds_copy: bool,
    /// Its synced kind (the claimants of other synced types are rivals too, [`Claims`]).
    pub(super) kind: String,
}

/// Whether `ours` may bring back the host object `host_name`, which `others` declare too.
///
/// vCluster's host names are ambiguous: `<name>-x-<namespace>-x-<vcluster>` is the same for
/// `web-tls` in namespace `a-x-team` and for `web-tls-x-a` in namespace `team`, so a tenant of
/// `team` could name another namespace's produced object (a Secret with its private key) as
/// its own. A host object is therefore brought back to one place only: when other synced
/// objects declare it under another namespace or virtual name, every claim is refused until
/// one is left; the copies already made are left as they are, no longer updated.
///
/// Whether a place already holds a copy is *not* a reason to keep copying to it: that is known
/// from marks on virtual objects (`vcp.dev/produced-for`, ...), which any virtual user can
/// write on an object of their own namespace, and a forged mark made the earlier rule ("the
/// first holder keeps it") copy another namespace's Secret, private key included, to the
/// forger (an attacker did). `holds_copy` only words the message.
///
/// # Errors
/// The refusal's message, naming the other claims.
pub(super) fn claim(
    ours: &Claimant,
    others: &[Claimant],
    host_name: &str,
    source_kind: &str,
    produced_kind: &str,
) -> Result<(), String> {
    let rivals: Vec<&Claimant> = others
        .iter()
        .filter(|o| o.key.namespace != ours.key.namespace || o.virtual_name != ours.virtual_name)
        .collect();
    if rivals.is_empty() {
        return Ok(());
    }
    let named = |c: &Claimant| {
        format!(
            "{}/{} (for {} {})",
            c.key.namespace, c.virtual_name, c.kind, c.key
        )
    };
    if let Some(holder) = rivals.iter().find(|c| c.holds_copy) {
        return Err(format!(
            "{source_kind} {}: the host {produced_kind} {host_name:?} was brought back as {}; the host name of {:?} in namespace {} is the same (vCluster's `<name>-x-<namespace>-x-<vcluster>` is ambiguous), so it is brought back nowhere while both declare it (copies already made are left as they are, no longer updated)",
            ours.key,
            named(holder),
            ours.virtual_name,
            ours.key.namespace
        ));
    }
    Err(format!(
        "{source_kind} {}: the host {produced_kind} {host_name:?} is the host name of {:?} in namespace {} and also of {}: an ambiguous name (vCluster's `<name>-x-<namespace>-x-<vcluster>`) is brought back nowhere while more than one place declares it",
        ours.key,
        ours.virtual_name,
        ours.key.namespace,
        rivals
            .iter()
            .map(|c| named(c))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Why the host name of `virtual_name` in virtual namespace `namespace` of vCluster `vcluster`
/// could also be another place's, or `None` when no other place can have it.
///
/// vCluster's host name is `<name>-x-<namespace>-x-<vcluster>` (shortened past 63 characters
/// to a prefix and a hash of that whole string, [`crate::translate::safe_concat_name`]). When
/// that whole string holds the separator `-x-` exactly twice (occurrences counted overlapping),
/// every (name, namespace, vCluster) that spells it puts its two separators at those two
/// places, so it is the only one: no other virtual namespace, no other synced type or plugin
/// (another runtime process) and no other vCluster in the same host namespace can declare the
/// same host name. With a third occurrence (`-x-` inside the name, the namespace or the
/// vCluster's name, or across a boundary as in `a-x` + `-x-` + `x-b`) another place can
/// (`web-tls` in `a-x-team` and `web-tls-x-a` in `team`), and a produced object made for one
/// (a Secret with its private key) would be copied to the other; while the one it was made for
/// exists the claims of one runtime see both ([`claim`]), but not another runtime's, nor a
/// claim made after it was deleted and its host object left behind. So such a name is brought
/// back nowhere.
pub fn ambiguous_host_name(virtual_name: &str, namespace: &str, vcluster: &str) -> Option<String> {
    let full = [virtual_name, "x", namespace, "x", vcluster].join("-");
    // bytes, not `&full[i..]`: the virtual name is a virtual user's string at `namePath`, and a
    // slice inside a multi-byte character panicked the type's whole task (ASCII `-x-` never
    // occurs inside a UTF-8 sequence, so the count is the same)
    let separators = full.as_bytes().windows(3).filter(|w| *w == b"-x-").count();
    (separators != 2).then(|| {
        format!(
            "{full:?} ({virtual_name:?} in virtual namespace {namespace:?} of vCluster {vcluster:?}) holds the separator \"-x-\" {separators} times, so another namespace, plugin or vCluster could declare the same host name and be given this one's object: objects of such a name are brought back nowhere; use a name and a namespace without \"-x-\""
        )
    })
}
