//! Size budgets: each plugin's part of the pod template, and the whole workload, judged
//! against a budget below what the API server can store, so that one big plugin never blocks
//! the others.
//!
//! Why: the API server's dry runs ([`crate::judge`]) accept a body of any size up to its
//! request limit, but it stores objects in etcd, which refuses a write larger than its
//! request limit (`--max-request-bytes`, 1.5 MiB by default: [`ETCD_REQUEST_LIMIT`]) with
//! `etcdserver: request is too large`. Every plugin of a vCluster shares one apply of its
//! workload, so without a budget two plugins that each pass their dry run make every apply of
//! that workload fail: no plugin of the vCluster installs, and no deletion can take its
//! plugin's entries out.
//!
//! The rule ([`admit_sizes`]): in installation order ([`install_order`]: creationTimestamp,
//! then name, as for `Conflict`, so the plugin that was there first keeps working), a plugin
//! is refused with `Ready=False, reason=TooLarge` ([`TooLarge`](vcp_crds::Reason::TooLarge)) when
//! - its own part is larger than [`PART_BUDGET`], or
//! - the rest of the workload ([`base_size`]: its pod template without the plugins' entries,
//!   its labels and annotations) plus the parts of the plugins admitted before it plus its own
//!   would exceed [`WORKLOAD_BUDGET`].
//!
//! A refused plugin does not count, so a later, smaller plugin may still fit. The refused
//! plugins are left out of the apply (and of the cleanup's), so neither another plugin's
//! installation nor a deletion waits on them.
//!
//! Sizes are bytes of JSON: a part is its containers, init containers and volumes as
//! [`plan`] makes them for that plugin alone, plus the field set the API server records for
//! them in `managedFields` ([`field_set`]: stored with the object too). The API server stores
//! `apps/v1` objects as protobuf, smaller than their JSON, so the estimate errs on the large
//! side.

use std::collections::BTreeMap;
use vcp_crds::Reason;

use k8s_openapi::api::core::v1::PodSpec;
use kube::ResourceExt;
use serde_json::Value;
use vcp_crds::VClusterPlugin;

use super::converge::{field_set, owned_entries};
use super::identity::{Refusal, SYNCER_CONTAINER, Workload};
use super::merge::{install_order, plan};

/// etcd's default request limit (`--max-request-bytes`, 1.5 MiB): the largest write the API
/// server can store, the object with its metadata and `managedFields` and the transaction's
/// overhead included.
pub const ETCD_REQUEST_LIMIT: usize = 1_572_864;

/// The budget of a whole workload's pod template (the vCluster's own part plus every installed
/// plugin's), in bytes of JSON: 1 MiB. The margin of 512 KiB below [`ETCD_REQUEST_LIMIT`] is
/// for what the estimate leaves out: the rest of the workload's metadata, its status, other
/// managers' `managedFields` entries and etcd's overhead.
pub const WORKLOAD_BUDGET: usize = 1_048_576;

/// The budget of one plugin's part, in bytes of JSON: 896 KiB, [`WORKLOAD_BUDGET`] less
/// 128 KiB, so a plugin that fits alone still leaves room for the vCluster's own pod template
/// (the vCluster chart's is about 10 KiB).
pub const PART_BUDGET: usize = 917_504;

/// The size of `plugin`'s part of `workload`: the pod-template entries [`plan`] makes for it
/// alone, and their field set, in bytes of JSON. 0 when [`plan`] refuses it there (a
/// conflict, not a vCluster: refused for that reason anyway).
///
/// For a copy slimmed in the operator's cache ([`crate::slim`]), the bytes its dropped config
/// added ([`Dropped::part_bytes`](crate::slim::marker::Dropped::part_bytes)) are added back: the size,
/// and so the verdict and its message, are those of the full spec.
pub fn part_size(workload: &Workload, plugin: &VClusterPlugin, runtime_image: &str) -> usize {
    let alone = plan(workload, &[plugin], runtime_image);
    if !alone.installed.contains(&plugin.name_any()) {
        return 0;
    }
    let spec = alone
        .patch
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(Value::Null);
    let dropped = crate::slim::marker::dropped(plugin).map_or(0, |d| d.part_bytes);
    json_len(&spec) + json_len(&field_set(&spec)) + dropped
}

/// The size of `workload` without the plugins' parts, in bytes of JSON: its live pod spec
/// without the containers and init containers the operator owns (the plugins' entries, which
/// the next apply replaces; the vCluster's `syncer` stays, of which the operator owns only a
/// mount), its labels and its pod template's, and its annotations
/// ([`Workload::annotations_bytes`]).
pub fn base_size(workload: &Workload) -> usize {
    let owned = owned_entries(&workload.managed_fields);
    let ours = |list: &str, name: &str| {
        name != SYNCER_CONTAINER
            && owned
                .pointer(&format!("/f:{list}"))
                .and_then(|l| l.get(format!("k:{}", serde_json::json!({ "name": name }))))
                .is_some()
    };
    let mut spec: PodSpec = workload.pod_spec.clone();
    spec.containers.retain(|c| !ours("containers", &c.name));
    if let Some(init) = spec.init_containers.as_mut() {
        init.retain(|c| !ours("initContainers", &c.name));
    }
    json_len(&spec)
        + json_len(&workload.labels)
        + json_len(&workload.template_labels)
        + workload.annotations_bytes
}

/// The plugins of `plugins` whose parts fit `workload`'s budgets, in installation order, and
/// the refusals (`TooLarge`) of the others by name: [`admit_sizes`] over [`base_size`] and
/// each plugin's [`part_size`].
pub fn admit<'a>(
    workload: &Workload,
    plugins: Vec<&'a VClusterPlugin>,
    runtime_image: &str,
) -> (Vec<&'a VClusterPlugin>, BTreeMap<String, Refusal>) {
    let sorted = install_order(&plugins);
    let sizes: Vec<(String, usize)> = sorted
        .iter()
        .map(|p| (p.name_any(), part_size(workload, p, runtime_image)))
        .collect();
    let place = format!(
        "{} {}/{}",
        workload.kind_str(),
        workload.namespace,
        workload.name
    );
    let refused = admit_sizes(&place, base_size(workload), &sizes);
    let kept = sorted
        .into_iter()
        .filter(|p| !refused.contains_key(&p.name_any()))
        .collect();
    (kept, refused)
}

/// The budget rule (module docs) on sizes alone: `base` bytes of the workload's own pod
/// template, `parts` the plugins' names and part sizes in installation order; returns the
/// refused ones by name. `place` names the workload in the messages.
pub fn admit_sizes(
    place: &str,
    base: usize,
    parts: &[(String, usize)],
) -> BTreeMap<String, Refusal> {
    let mut refused = BTreeMap::new();
    let mut total = base;
    let mut admitted: Vec<&str> = Vec::new();
    for (name, size) in parts {
        let message = if *size > PART_BUDGET {
            format!(
                "the plugin's part of {place} (its containers, env, args and mounts) is {size} bytes, above the operator's budget of {PART_BUDGET} bytes per plugin (etcd stores at most {ETCD_REQUEST_LIMIT} bytes per object); make it smaller, such as by moving large env values into a ConfigMap"
            )
        } else if total + size > WORKLOAD_BUDGET {
            format!(
                "the plugin's part of {place} is {size} bytes; with the {base} bytes of the vCluster's own pod template and metadata and the {} bytes of the older plugins installed there ({}) the workload would reach {} bytes, above the operator's budget of {WORKLOAD_BUDGET} bytes per workload (etcd stores at most {ETCD_REQUEST_LIMIT} bytes per object); make this plugin smaller, or remove another plugin of the vCluster",
                total - base,
                if admitted.is_empty() {
                    "none".to_string()
                } else {
                    admitted.join(", ")
                },
                total + size
            )
        } else {
            total += size;
            admitted.push(name);
            continue;
        };
        refused.insert(
            name.clone(),
            Refusal {
                reason: Reason::TooLarge,
                message,
            },
        );
    }
    refused
}

/// Bytes of `v` as JSON (0 when it cannot be serialized).
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(list: &[(&str, usize)]) -> Vec<(String, usize)> {
        list.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    #[test]
    fn the_later_plugin_that_would_cross_the_workload_budget_is_refused() {
        let refused = admit_sizes(
            "StatefulSet a/b",
            10_000,
            &parts(&[("first", 800_000), ("second", 800_000), ("small", 2_000)]),
        );
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["second"]);
        let r = &refused["second"];
        assert_eq!(r.reason, Reason::TooLarge);
        assert!(r.message.contains("1610000 bytes"), "{}", r.message);
        assert!(r.message.contains("(first)"), "{}", r.message);
    }

    #[test]
    fn a_part_above_its_own_budget_is_refused_even_alone() {
        let refused = admit_sizes("StatefulSet a/b", 0, &parts(&[("huge", PART_BUDGET + 1)]));
        assert!(refused["huge"].message.contains("per plugin"));
        assert!(admit_sizes("StatefulSet a/b", 0, &parts(&[("fits", PART_BUDGET)])).is_empty());
    }

    #[test]
    fn exactly_the_budget_fits_and_the_base_counts() {
        let half = WORKLOAD_BUDGET / 2;
        assert!(admit_sizes("s", 0, &parts(&[("a", half), ("b", half)])).is_empty());
        let refused = admit_sizes("s", 1, &parts(&[("a", half), ("b", half)]));
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["b"]);
        // A workload too large on its own admits nothing.
        let refused = admit_sizes("s", WORKLOAD_BUDGET, &parts(&[("a", 1)]));
        assert!(
            refused["a"].message.contains("none"),
            "{}",
            refused["a"].message
        );
    }

    /// [`admit`] on real plugins: the parts are measured from what [`plan`] makes, the later
    /// of two plugins of 800 KB of env is refused, a small one after it is admitted, and the
    /// workload's annotations count.
    #[test]
    fn admit_measures_the_parts_plan_makes() {
        use k8s_openapi::api::core::v1::{Container, EnvVar};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use vcp_crds::{FINALIZER, VClusterPluginSpec, VClusterRef};

        let labels = BTreeMap::from([
            ("app".to_string(), "vcluster".to_string()),
            ("release".to_string(), "vc".to_string()),
        ]);
        let wl = Workload {
            name: "vc".into(),
            namespace: "ns".into(),
            labels: labels.clone(),
            template_labels: labels,
            pod_spec: PodSpec {
                service_account_name: Some("vc-vc".into()),
                containers: vec![Container {
                    name: SYNCER_CONTAINER.into(),
                    image: Some("syncer".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        // A v1 sidecar image: the embedded runtime's container takes no `env` but `RUST_LOG`.
        let plugin = |name: &str, secs: i64, env_bytes: usize| {
            let env = (0..env_bytes.div_ceil(32_000))
                .map(|i| EnvVar {
                    name: format!("E{i}"),
                    value: Some("x".repeat(32_000)),
                    ..Default::default()
                })
                .collect::<Vec<_>>();
            let mut p = VClusterPlugin::new(
                name,
                VClusterPluginSpec {
                    vcluster: VClusterRef { name: "vc".into() },
                    image: Some("img".into()),
                    version: Some(vcp_crds::PluginVersion::V1),
                    env: (!env.is_empty()).then_some(env),
                    ..Default::default()
                },
            );
            p.metadata.namespace = Some("ns".into());
            p.metadata.finalizers = Some(vec![FINALIZER.into()]);
            p.metadata.creation_timestamp = Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
            ));
            p
        };
        let (first, second, small) = (
            plugin("first", 1, 800_000),
            plugin("second", 2, 800_000),
            plugin("small", 3, 0),
        );
        let size = part_size(&wl, &first, "rt");
        assert!((800_000..820_000).contains(&size), "{size}");
        // Given in any order, judged in installation order.
        let (kept, refused) = admit(&wl, vec![&small, &second, &first], "rt");
        let kept: Vec<String> = kept.iter().map(|p| p.name_any()).collect();
        assert_eq!(kept, ["first", "small"]);
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["second"]);

        // Annotations as large as the budget leave room for nothing.
        let heavy = Workload {
            annotations_bytes: WORKLOAD_BUDGET,
            ..wl.clone()
        };
        let (kept, _) = admit(&heavy, vec![&small], "rt");
        assert!(kept.is_empty());
    }

    #[test]
    fn budgets_keep_their_documented_margin() {
        const {
            assert!(WORKLOAD_BUDGET + 512 * 1024 <= ETCD_REQUEST_LIMIT);
            assert!(PART_BUDGET + 128 * 1024 <= WORKLOAD_BUDGET);
        }
    }
}
