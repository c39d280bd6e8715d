//! The expected verdicts follow Kubernetes' own rules (the LimitRanger and ResourceQuota
//! admission plugins, the scheduler's fit on allocatable), computed by hand from the figures.

use super::*;
use crate::workload::{RUNTIME_LIMITS, RUNTIME_REQUESTS, SYNCER_CONTAINER, WorkloadKind};
use k8s_openapi::api::core::v1::{
    LimitRangeItem, LimitRangeSpec, PodSpec, ResourceQuotaSpec, ResourceQuotaStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use vcp_crds::{FINALIZER, PluginVersion, VClusterPluginSpec, VClusterRef};

const RUNTIME: &str = "ghcr.io/vcp-dev/vcluster-plugin-operator:test";

fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

/// A vCluster StatefulSet whose `syncer` requests `syncer_requests` and is limited to
/// `syncer_limits`.
fn workload(syncer_requests: &[(&str, &str)], syncer_limits: &[(&str, &str)]) -> Workload {
    let labels: BTreeMap<String, String> = [("app", "vcluster"), ("release", "my-vcluster")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Workload {
        kind: Some(WorkloadKind::StatefulSet),
        name: "my-vcluster".into(),
        namespace: "team-a".into(),
        labels: labels.clone(),
        template_labels: labels,
        pod_spec: PodSpec {
            service_account_name: Some("vc-my-vcluster".into()),
            containers: vec![Container {
                name: SYNCER_CONTAINER.into(),
                image: Some("ghcr.io/loft-sh/vcluster-pro:0.30.0".into()),
                resources: Some(ResourceRequirements {
                    requests: Some(list(syncer_requests)),
                    limits: Some(list(syncer_limits)),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
        uid: Some("u1".into()),
        generation: Some(1),
        ..Default::default()
    }
}

/// An embedded-runtime plugin created at `secs`.
fn embedded(name: &str, secs: i64) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        name,
        VClusterPluginSpec {
            vcluster: VClusterRef {
                name: "my-vcluster".into(),
            },
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("team-a".into());
    p.metadata.finalizers = Some(vec![FINALIZER.into()]);
    p.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
    ));
    p
}

/// A v1 image plugin asking for `requests` and `limits`.
fn image(
    name: &str,
    secs: i64,
    requests: &[(&str, &str)],
    limits: &[(&str, &str)],
) -> VClusterPlugin {
    let mut p = embedded(name, secs);
    p.spec.image = Some("example.com/p:1".into());
    p.spec.version = Some(PluginVersion::V1);
    p.spec.resources = Some(ResourceRequirements {
        requests: Some(list(requests)).filter(|l| !l.is_empty()),
        limits: Some(list(limits)).filter(|l| !l.is_empty()),
        ..Default::default()
    });
    p
}

fn limit_range(item: LimitRangeItem) -> LimitRange {
    LimitRange {
        metadata: ObjectMeta {
            name: Some("limits".into()),
            ..Default::default()
        },
        spec: Some(LimitRangeSpec { limits: vec![item] }),
    }
}

fn quota(hard: &[(&str, &str)], used: &[(&str, &str)]) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some("compute".into()),
            ..Default::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(list(hard)),
            ..Default::default()
        }),
        status: Some(ResourceQuotaStatus {
            hard: Some(list(hard)),
            used: Some(list(used)),
        }),
    }
}

fn node(name: &str, cpu: &str, memory: &str) -> (String, BTreeMap<String, Quantity>) {
    (name.into(), list(&[("cpu", cpu), ("memory", memory)]))
}

fn judge(wl: &Workload, plugins: &[&VClusterPlugin], facts: &ResourceFacts) -> Vec<String> {
    let refused = refusals(wl, plugins, facts, RUNTIME);
    for r in refused.values() {
        assert_eq!(r.reason, Reason::ResourcesExceeded);
    }
    refused.into_keys().collect()
}

fn message(
    wl: &Workload,
    plugins: &[&VClusterPlugin],
    facts: &ResourceFacts,
    name: &str,
) -> String {
    refusals(wl, plugins, facts, RUNTIME)
        .remove(name)
        .unwrap_or_else(|| panic!("{name} refused"))
        .message
}

/// The defaults the tests below reason with: the runtime asks for 100m / 96Mi, limited to
/// 1 / 256Mi.
#[test]
fn the_runtime_defaults_are_the_figures_reasoned_with() {
    assert_eq!(RUNTIME_REQUESTS, [("cpu", "100m"), ("memory", "96Mi")]);
    assert_eq!(RUNTIME_LIMITS, [("cpu", "1"), ("memory", "256Mi")]);
}

#[test]
fn nothing_is_refused_without_limits_quotas_or_nodes() {
    let wl = workload(&[], &[]);
    let big = image("big", 1, &[("memory", "100Ti")], &[]);
    let e = embedded("e", 2);
    let facts = ResourceFacts {
        replicas: 1,
        ..Default::default()
    };
    assert!(judge(&wl, &[&big, &e], &facts).is_empty());
}

/// The attack: 100Ti of memory, beside another author's plugin. No node holds it; the other
/// plugin is kept.
#[test]
fn a_pod_no_node_can_hold_is_refused_and_the_others_kept() {
    let wl = workload(&[("cpu", "200m"), ("memory", "256Mi")], &[]);
    let big = image("big", 2, &[("memory", "100Ti")], &[]);
    let other = embedded("other", 1);
    let facts = ResourceFacts {
        nodes: vec![node("n1", "4", "16Gi"), node("n2", "8", "32Gi")],
        replicas: 1,
        ..Default::default()
    };
    assert_eq!(judge(&wl, &[&big, &other], &facts), ["big"]);
    let m = message(&wl, &[&big, &other], &facts, "big");
    // 200m + 100m (the runtime) + 0; 256Mi + 96Mi + 100Ti
    // 100Ti is 104857600Mi
    assert!(
        m.contains(
            "no node can hold the vCluster's pod, which would request cpu 300m, memory 104857952Mi"
        ),
        "{m}"
    );
    assert!(m.contains("node n2 with cpu 8, memory 32Gi"), "{m}");
    // what fits on the larger node passes, whichever resource the smaller one lacks
    let fits = image("fits", 2, &[("cpu", "6"), ("memory", "20Gi")], &[]);
    assert!(judge(&wl, &[&fits], &facts).is_empty());
    let too_much_cpu = image("cpu", 2, &[("cpu", "9")], &[]);
    assert_eq!(judge(&wl, &[&too_much_cpu], &facts), ["cpu"]);
    // no node listed (none registered, or not readable): not judged
    let blind = ResourceFacts {
        replicas: 1,
        ..Default::default()
    };
    assert!(judge(&wl, &[&big], &blind).is_empty());
}

/// LimitRange `Container` `max`: the runtime's default limit (256Mi) is above a namespace's
/// 128Mi, so an embedded plugin is refused unless its `spec.resources` fits.
#[test]
fn a_limit_range_maximum_refuses_the_runtime_default_and_a_fitting_override_passes() {
    let wl = workload(&[], &[("memory", "100Mi")]);
    let facts = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Container".into(),
            max: Some(list(&[("memory", "128Mi")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    let e = embedded("e", 1);
    assert_eq!(judge(&wl, &[&e], &facts), ["e"]);
    let m = message(&wl, &[&e], &facts, "e");
    assert!(
        m.contains("LimitRange limits allows at most 128Mi of memory per container, and container e asks for a memory limit of 256Mi"),
        "{m}"
    );
    let mut fitting = embedded("fitting", 1);
    fitting.spec.resources = Some(ResourceRequirements {
        limits: Some(list(&[("memory", "128Mi")])),
        ..Default::default()
    });
    assert!(judge(&wl, &[&fitting], &facts).is_empty());
    // a max on a value the container leaves out: a v1 plugin without a memory limit
    let bare = image("bare", 1, &[], &[]);
    let m = message(&wl, &[&bare], &facts, "bare");
    assert!(m.contains("container bare sets no memory limit"), "{m}");
}

/// The vCluster's own container already breaks a rule: no plugin is blamed for it, only one
/// that breaks a rule of its own.
#[test]
fn a_rule_the_vcluster_breaks_itself_refuses_no_plugin() {
    let wl = workload(&[], &[("memory", "1Gi")]);
    let facts = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Container".into(),
            max: Some(list(&[("memory", "512Mi")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    let small = image("small", 1, &[], &[("memory", "64Mi")]);
    let big = image("big", 2, &[], &[("memory", "600Mi")]);
    assert_eq!(judge(&wl, &[&small, &big], &facts), ["big"]);
}

/// `min` and `maxLimitRequestRatio`: the runtime's CPU limit is 10 times its request.
#[test]
fn a_limit_range_minimum_and_ratio() {
    let wl = workload(&[], &[]);
    let ratio = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Container".into(),
            max_limit_request_ratio: Some(list(&[("cpu", "4")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    // `syncer` sets no CPU at all: the vCluster's own, not blamed
    let e = embedded("e", 1);
    let m = message(&wl, &[&e], &ratio, "e");
    assert!(
        m.contains(
            "allows a cpu limit at most 4 times the request, and container e asks for 1 and 100m"
        ),
        "{m}"
    );
    let four = image("four", 1, &[("cpu", "250m")], &[("cpu", "1")]);
    assert!(judge(&wl, &[&four], &ratio).is_empty());
    let min = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Container".into(),
            min: Some(list(&[("memory", "128Mi")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    // 96Mi requested by default: below the minimum
    assert_eq!(judge(&wl, &[&e], &min), ["e"]);
}

/// A LimitRange's defaults fill what a container leaves out, before any check: a request
/// given alone above the default limit makes an invalid container.
#[test]
fn limit_range_defaults_fill_in_and_can_fall_below_a_request() {
    let wl = workload(&[], &[]);
    let facts = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Container".into(),
            default: Some(list(&[("memory", "64Mi")])),
            default_request: Some(list(&[("memory", "32Mi")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    let asks = image("asks", 1, &[("memory", "128Mi")], &[]);
    let m = message(&wl, &[&asks], &facts, "asks");
    assert!(
        m.contains("container asks would request 128Mi of memory, above its limit 64Mi"),
        "{m}"
    );
    let bare = image("bare", 1, &[], &[]);
    assert!(judge(&wl, &[&bare], &facts).is_empty());
    // a request above a limit the container sets itself: the API server's own refusal (the
    // dry runs' `InvalidWorkload`), not judged here
    let invalid = image("invalid", 1, &[("cpu", "2")], &[("cpu", "1")]);
    assert!(judge(&wl, &[&invalid], &facts).is_empty());
}

/// A LimitRange of type `Pod` bounds the sum over the pod's containers.
#[test]
fn a_pod_maximum_bounds_the_sum() {
    let wl = workload(&[("memory", "256Mi")], &[("memory", "512Mi")]);
    let facts = ResourceFacts {
        limit_ranges: vec![limit_range(LimitRangeItem {
            type_: "Pod".into(),
            max: Some(list(&[("memory", "1Gi")])),
            ..Default::default()
        })],
        replicas: 1,
        ..Default::default()
    };
    // 512Mi + 256Mi (one runtime) fits; + 256Mi again is exactly 1Gi: fits; a third is over
    let a = embedded("a", 1);
    let b = embedded("b", 2);
    let c = embedded("c", 3);
    assert_eq!(judge(&wl, &[&c, &b, &a], &facts), ["c"]);
    let m = message(&wl, &[&a, &b, &c], &facts, "c");
    assert!(
        m.contains("LimitRange limits allows at most 1Gi of memory per pod, and its containers' memory limits add up to 1280Mi"),
        "{m}"
    );
}

/// A ResourceQuota: the new pods' usage in place of the current pods' must fit; one plugin
/// fits and the next, together with it, does not.
#[test]
fn a_quota_counts_the_new_pods_in_place_of_the_current_ones() {
    // the current pod: syncer limited to 512Mi; 600Mi of the 1Gi used in the namespace
    let wl = workload(&[("memory", "256Mi")], &[("memory", "512Mi")]);
    let mut facts = ResourceFacts {
        quotas: vec![quota(
            &[("limits.memory", "1Gi")],
            &[("limits.memory", "600Mi")],
        )],
        replicas: 1,
        ..Default::default()
    };
    // 600 - 512 + 512 + 256 = 856Mi: fits; + 256 = 1112Mi: over
    let a = embedded("a", 1);
    let b = embedded("b", 2);
    assert_eq!(judge(&wl, &[&a, &b], &facts), ["b"]);
    let m = message(&wl, &[&a, &b], &facts, "b");
    assert!(
        m.contains("ResourceQuota compute allows 1Gi of limits.memory in the namespace, 600Mi are used, and the vCluster's 1 pod(s) would ask for 1Gi each instead of 512Mi"),
        "{m}"
    );
    // two replicas: the first does not fit either (600 - 1024 + 1536 = 1112Mi)
    facts.replicas = 2;
    assert_eq!(judge(&wl, &[&a, &b], &facts), ["a", "b"]);
    // a quota on requests only: the runtimes' 96Mi each fit in 2Gi
    let requests = ResourceFacts {
        quotas: vec![quota(
            &[("requests.memory", "2Gi")],
            &[("requests.memory", "1Gi")],
        )],
        replicas: 1,
        ..Default::default()
    };
    assert!(judge(&wl, &[&a, &b], &requests).is_empty());
}

/// A quota tracking `limits.cpu` needs every container to set it: an image plugin without
/// resources is refused, unless a LimitRange default fills it in. The vCluster's own `syncer`
/// without one is not the plugin's doing.
#[test]
fn a_quota_needs_every_container_to_set_what_it_tracks() {
    let wl = workload(&[], &[]);
    let bare = image("bare", 1, &[], &[]);
    let e = embedded("e", 2);
    let mut facts = ResourceFacts {
        quotas: vec![quota(&[("limits.cpu", "10")], &[("limits.cpu", "0")])],
        replicas: 1,
        ..Default::default()
    };
    assert_eq!(judge(&wl, &[&bare, &e], &facts), ["bare"]);
    let m = message(&wl, &[&bare], &facts, "bare");
    assert!(
        m.contains("ResourceQuota compute tracks limits.cpu, so every container must set it, and container bare does not"),
        "{m}"
    );
    facts.limit_ranges = vec![limit_range(LimitRangeItem {
        type_: "Container".into(),
        default: Some(list(&[("cpu", "500m")])),
        ..Default::default()
    })];
    assert!(judge(&wl, &[&bare, &e], &facts).is_empty());
}
