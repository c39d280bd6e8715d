use super::*;
use crate::workload::{PLUGINS_VOLUME, SYNCER_CONTAINER, WorkloadKind};
use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use vcp_crds::Reason;
use vcp_crds::{FINALIZER, VClusterPluginSpec, VClusterRef};

const RUNTIME: &str = "ghcr.io/vcp-dev/vcluster-plugin-operator:test";

/// A vCluster-chart-shaped StatefulSet (the chart's labels, `syncer`, its service account).
fn workload() -> Workload {
    let labels: std::collections::BTreeMap<String, String> =
        [("app", "vcluster"), ("release", "my-vcluster")]
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
                image: Some("ghcr.io/loft-sh/vcluster-pro:0.26.0".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
        uid: Some("u1".into()),
        generation: Some(1),
        ..Default::default()
    }
}

fn plugin(name: &str, secs: i64) -> VClusterPlugin {
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

/// [`plugin`] as a v1 sidecar image (the embedded runtime's container takes no mount of a
/// spec's).
fn sidecar(name: &str, secs: i64) -> VClusterPlugin {
    let mut p = plugin(name, secs);
    p.spec.image = Some("img".into());
    p.spec.version = Some(vcp_crds::PluginVersion::V1);
    p
}

fn mounting(mut p: VClusterPlugin, volume: &str) -> VClusterPlugin {
    p.spec.volume_mounts = Some(vec![VolumeMount {
        name: volume.into(),
        mount_path: "/x".into(),
        ..Default::default()
    }]);
    p
}

/// A stand-in for the API server: refuses a body with a mount of a volume the pod lacks
/// (as its validation does), a Pod whose containers `invalid` names run as invalid (as its
/// validation would), and a Pod whose containers `forbidden` names run (as Pod Security
/// admission would, message in its format). While `unjudged` is set, it answers every Pod with
/// an error that judges nothing (a pod quota's 403).
struct Fake {
    forbidden: Vec<&'static str>,
    invalid: Vec<&'static str>,
    unjudged: AtomicBool,
    workload_calls: AtomicUsize,
    pod_calls: AtomicUsize,
}

impl Fake {
    fn new(forbidden: Vec<&'static str>) -> Self {
        Fake {
            forbidden,
            invalid: Vec::new(),
            unjudged: AtomicBool::new(false),
            workload_calls: AtomicUsize::new(0),
            pod_calls: AtomicUsize::new(0),
        }
    }
    fn refusing_as_invalid(invalid: Vec<&'static str>) -> Self {
        Fake {
            invalid,
            ..Fake::new(vec![])
        }
    }
    fn calls(&self) -> (usize, usize) {
        (
            self.workload_calls.load(Ordering::SeqCst),
            self.pod_calls.load(Ordering::SeqCst),
        )
    }
}

impl DryRun for Fake {
    fn workload(
        &self,
        w: &Workload,
        body: &Value,
    ) -> impl Future<Output = Result<WorkloadAnswer>> + Send {
        self.workload_calls.fetch_add(1, Ordering::SeqCst);
        let spec = body
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(json!({}));
        let volumes: Vec<String> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        let mut containers: Vec<Container> =
            serde_json::from_value(spec["containers"].clone()).unwrap_or_default();
        let init: Vec<Container> =
            serde_json::from_value(spec["initContainers"].clone()).unwrap_or_default();
        containers.retain(|c| c.name != SYNCER_CONTAINER);
        let mut answer = None;
        for c in containers.iter().chain(&init) {
            for m in c.volume_mounts.iter().flatten() {
                if !volumes.contains(&m.name) && answer.is_none() {
                    answer = Some(WorkloadAnswer::Refused(format!(
                        "StatefulSet.apps \"{}\" is invalid: spec.template.spec.containers[1].volumeMounts[0].name: Not found: \"{}\"",
                        w.name, m.name
                    )));
                }
            }
        }
        let mut pod_spec = w.pod_spec.clone();
        pod_spec.containers.extend(containers);
        let answer = answer.unwrap_or_else(|| {
            WorkloadAnswer::Accepted(Box::new(Pod {
                spec: Some(pod_spec),
                ..Default::default()
            }))
        });
        async move { Ok(answer) }
    }

    fn pod(&self, pod: &Pod) -> impl Future<Output = Result<PodAnswer>> + Send {
        self.pod_calls.fetch_add(1, Ordering::SeqCst);
        if self.unjudged.load(Ordering::SeqCst) {
            // the API server's wording for a pod quota used up (code 403)
            let answer = PodAnswer::Unjudged(
                "403: pods \"my-vcluster-vcp-hooks-check-x\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=10, limited: pods=10".into(),
            );
            return std::future::ready(Ok(answer));
        }
        let invalid = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .position(|c| self.invalid.contains(&c.name.as_str()));
        if let Some(i) = invalid {
            // the API server's wording for a field its validation refuses
            let answer = PodAnswer::Invalid(format!(
                "Pod \"my-vcluster-vcp-hooks-check-x\" is invalid: spec.containers[{i}].securityContext.seccompProfile.type: Unsupported value: \"vcp-representative\": supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\""
            ));
            return std::future::ready(Ok(answer));
        }
        let bad: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .filter(|c| self.forbidden.contains(&c.name.as_str()))
            .map(|c| format!("{:?}", c.name))
            .collect();
        let answer = (!bad.is_empty()).then(|| {
            format!(
                "pods \"my-vcluster-vcp-check-x\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true (pod or container{} {} must set securityContext.runAsNonRoot=true)",
                if bad.len() > 1 { "s" } else { "" },
                bad.join(", ")
            )
        });
        let answer = answer
            .and_then(|m| pod_security_violation(&m))
            .map_or(PodAnswer::Admitted, PodAnswer::Violates);
        std::future::ready(Ok(answer))
    }
}

fn run<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn parses_the_pod_security_message() {
    // The format of k8s.io/pod-security-admission v0.34 (admission.go, EvaluatePod;
    // policy/check_*.go for the details).
    let m = "pods \"x\" is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"p\" must set securityContext.allowPrivilegeEscalation=false), runAsNonRoot != true (pod or containers \"syncer\", \"p\" must set securityContext.runAsNonRoot=true)";
    let v = pod_security_violation(m).unwrap();
    assert_eq!(v.level, "restricted:latest");
    assert!(v.detail.starts_with("allowPrivilegeEscalation != false"));
    assert!(blames(&v, "p"));
    assert!(blames(&v, "syncer"));
    assert!(!blames(&v, "s"), "whole names only");
    let v = pod_security_violation("pods \"x\" is forbidden: violates PodSecurity \"baseline:v1.34\": unrestricted capabilities (containers \"a\", \"b-c\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add), restricted volume types (volume \"data\" uses restricted volume type \"hostPath\")").unwrap();
    assert_eq!(v.level, "baseline:v1.34");
    assert_eq!(
        named_containers(&v),
        BTreeSet::from(["a".to_string(), "b-c".to_string()])
    );
    assert!(!blames(&v, "data"), "a volume is no container");
    assert_eq!(
        pod_security_violation("pods \"x\" is forbidden: exceeded quota"),
        None
    );
}

#[test]
fn a_statefulsets_pod_gets_its_claims_as_volumes() {
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": { "name": "my-vcluster", "namespace": "team-a" },
        "spec": {
            "selector": {}, "serviceName": "x",
            "template": {
                "metadata": { "labels": { "app": "vcluster" } },
                "spec": {
                    "containers": [{ "name": "syncer", "volumeMounts": [{ "name": "data", "mountPath": "/data" }] }],
                    "volumes": [{ "name": "data", "emptyDir": {} }, { "name": "plugins", "emptyDir": {} }],
                },
            },
            "volumeClaimTemplates": [{ "metadata": { "name": "data" } }],
        },
    }))
    .unwrap();
    let pod = pod_of_statefulset(&sts);
    assert_eq!(
        serde_json::to_value(&pod).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "generateName": "my-vcluster-vcp-check-",
                "namespace": "team-a",
                "labels": { "app": "vcluster" },
            },
            "spec": {
                "containers": [{ "name": "syncer", "volumeMounts": [{ "name": "data", "mountPath": "/data" }] }],
                "volumes": [
                    { "name": "data", "persistentVolumeClaim": { "claimName": "data-my-vcluster-0" } },
                    { "name": "plugins", "emptyDir": {} },
                ],
            },
        })
    );
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "vc", "namespace": "team-b" },
        "spec": { "selector": {}, "template": { "spec": { "containers": [{ "name": "syncer" }] } } },
    }))
    .unwrap();
    let pod = pod_of_deployment(&deploy);
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("vc-vcp-check-"));
    assert_eq!(pod.spec.unwrap().containers[0].name, "syncer");
}

#[test]
fn all_good_costs_one_dry_run_of_each_kind() {
    let a = plugin("a", 1);
    let b = plugin("b", 2);
    let fake = Fake::new(vec![]);
    let refused = run(judge(&fake, &workload(), &[&a, &b], RUNTIME)).unwrap();
    assert!(refused.is_empty());
    assert_eq!(fake.calls(), (1, 1));
}

#[test]
fn the_bad_plugin_is_refused_and_the_others_accepted() {
    let good_old = plugin("good-old", 1);
    let bad = mounting(sidecar("bad", 2), "nope");
    let good_new = plugin("good-new", 3);
    let fake = Fake::new(vec![]);
    let refused = run(judge(
        &fake,
        &workload(),
        &[&good_new, &bad, &good_old],
        RUNTIME,
    ))
    .unwrap();
    assert_eq!(refused.keys().collect::<Vec<_>>(), ["bad"]);
    let r = &refused["bad"];
    assert_eq!(r.reason, Reason::InvalidWorkload);
    assert_eq!(
        r.message,
        "the API server refuses StatefulSet team-a/my-vcluster with this plugin's part: StatefulSet.apps \"my-vcluster\" is invalid: spec.template.spec.containers[1].volumeMounts[0].name: Not found: \"nope\""
    );
    // All at once, then one step per plugin.
    assert_eq!(fake.calls().0, 4);
}

/// An attack: a plugin's own mount of `plugins` (the operator's volume; a
/// spec stored before the CRD refused it) never reaches the pod, with or without a v2 plugin
/// beside it: the stand-in API server, which refuses a mount of a missing volume, sees none.
#[test]
fn a_mount_of_the_plugins_volume_never_reaches_the_pod() {
    let mut v2 = plugin("v2", 1);
    v2.spec.image = Some("img".into());
    let user = mounting(sidecar("user", 2), PLUGINS_VOLUME);
    let runtime = mounting(plugin("runtime", 3), PLUGINS_VOLUME);
    let fake = Fake::new(vec![]);
    let refused = run(judge(&fake, &workload(), &[&user, &runtime], RUNTIME)).unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    let refused = run(judge(&fake, &workload(), &[&v2, &user, &runtime], RUNTIME)).unwrap();
    assert!(refused.is_empty(), "{refused:?}");
}

#[test]
fn pod_security_refuses_only_the_plugins_it_names() {
    let loose = plugin("loose", 1);
    let tight = plugin("tight", 2);
    let fake = Fake::new(vec!["loose", SYNCER_CONTAINER]);
    let refused = run(judge(&fake, &workload(), &[&tight, &loose], RUNTIME)).unwrap();
    assert_eq!(refused.keys().collect::<Vec<_>>(), ["loose"]);
    assert_eq!(refused["loose"].reason, Reason::PolicyDenied);
    assert_eq!(
        refused["loose"].message,
        "with this plugin's container the vCluster's pods would violate the Pod Security level \"restricted:latest\" enforced in namespace team-a (label pod-security.kubernetes.io/enforce); the API server's reason: runAsNonRoot != true (pod or containers \"syncer\", \"loose\" must set securityContext.runAsNonRoot=true)"
    );
    // The vCluster's own container alone refuses no plugin.
    let fake = Fake::new(vec![SYNCER_CONTAINER]);
    let refused = run(judge(&fake, &workload(), &[&tight], RUNTIME)).unwrap();
    assert!(refused.is_empty());
    assert_eq!(fake.calls(), (1, 1));
}

#[test]
fn verdicts_are_remembered_per_body_and_generation() {
    let good = plugin("good", 1);
    let bad = mounting(sidecar("bad", 2), "nope");
    let verdicts = Verdicts::default();
    let fake = Fake::new(vec![]);
    let wl = workload();
    let first = run(verdicts.refusals(&fake, &wl, &[&good, &bad], RUNTIME)).unwrap();
    assert!(first.contains_key("bad"));
    let calls = fake.calls();
    // Same body, same generation: no request.
    let again = run(verdicts.refusals(&fake, &wl, &[&bad, &good], RUNTIME)).unwrap();
    assert_eq!(again, first);
    assert_eq!(fake.calls(), calls);
    // The operator applied the good part: still no request at the new generation.
    verdicts.applied(&wl, Some(2));
    let mut applied = wl.clone();
    applied.generation = Some(2);
    run(verdicts.refusals(&fake, &applied, &[&good, &bad], RUNTIME)).unwrap();
    assert_eq!(fake.calls(), calls);
    // Someone else changed the spec: judged again.
    let mut changed = applied.clone();
    changed.generation = Some(3);
    run(verdicts.refusals(&fake, &changed, &[&good, &bad], RUNTIME)).unwrap();
    assert!(fake.calls().0 > calls.0);
    // Another body: judged again.
    let calls = fake.calls();
    run(verdicts.refusals(&fake, &changed, &[&good], RUNTIME)).unwrap();
    assert!(fake.calls().0 > calls.0);
    // A recreated workload (same generation, other uid): judged again.
    let calls = fake.calls();
    let mut recreated = changed.clone();
    recreated.uid = Some("u2".into());
    run(verdicts.refusals(&fake, &recreated, &[&good], RUNTIME)).unwrap();
    assert!(fake.calls().0 > calls.0);
    // Forgotten: judged again.
    verdicts.forget(&recreated);
    let calls = fake.calls();
    run(verdicts.refusals(&fake, &recreated, &[&good], RUNTIME)).unwrap();
    assert!(fake.calls().0 > calls.0);
}

#[test]
fn the_verdicts_of_a_gone_workload_are_pruned() {
    let bad = mounting(sidecar("bad", 2), "nope");
    let verdicts = Verdicts::default();
    let fake = Fake::new(vec![]);
    let wl = workload();
    run(verdicts.refusals(&fake, &wl, &[&bad], RUNTIME)).unwrap();
    let held = verdicts.entries();
    assert_eq!(held.0, 1, "judged by dry run: {held:?}");
    verdicts.retain(|kind, namespace, name| {
        (kind, namespace, name) == ("StatefulSet", "team-a", "my-vcluster")
    });
    assert_eq!(verdicts.entries(), held, "its workload still exists");
    verdicts.retain(|kind, _, _| kind == "Deployment");
    assert_eq!(verdicts.entries(), (0, 0), "its workload is gone");
    // Judged again, not answered from a pruned verdict.
    let calls = fake.calls();
    run(verdicts.refusals(&fake, &wl, &[&bad], RUNTIME)).unwrap();
    assert!(fake.calls().0 > calls.0);
}

#[test]
fn nothing_to_judge_costs_nothing() {
    let verdicts = Verdicts::default();
    let fake = Fake::new(vec![]);
    assert!(
        run(verdicts.refusals(&fake, &workload(), &[], RUNTIME))
            .unwrap()
            .is_empty()
    );
    assert_eq!(fake.calls(), (0, 0));
}

fn pod_hook(p: VClusterPlugin, name: &str, path: &str, value: Value) -> VClusterPlugin {
    let mut p = p;
    p.spec.hooks.push(vcp_crds::Hook {
        name: name.into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
        events: vec![vcp_crds::HookEvent::CreatePhysical],
        json_patch: vec![vcp_crds::JsonPatchOperation {
            op: vcp_crds::JsonPatchOp::Add,
            path: path.into(),
            from: None,
            value: Some(value),
        }],
        ..Default::default()
    });
    p
}

/// Plugin `good`, whose hook `team` sets a label, and plugin `name`, whose hook `hook` adds a
/// container `container`.
fn labelling_and_adding_a_container(
    name: &str,
    hook: &str,
    container: &str,
) -> [VClusterPlugin; 2] {
    [
        pod_hook(
            plugin("good", 1),
            "team",
            "/metadata/labels/team",
            json!("a"),
        ),
        pod_hook(
            plugin(name, 2),
            hook,
            "/spec/containers/-",
            json!({"name": container, "image": "registry.example.com/x:1"}),
        ),
    ]
}

/// [`Verdicts::hook_refusals`] of `plugins` for [`workload`] under the default container
/// policy, with `verdicts` and the stand-in API server `fake`.
fn hook_refusals(
    verdicts: &Verdicts,
    fake: &Fake,
    plugins: &[&VClusterPlugin],
) -> BTreeMap<String, Refusal> {
    run(verdicts.hook_refusals(fake, &workload(), plugins, &ContainerPolicy::default())).unwrap()
}

/// Asserts that `refused` refuses the plugin `name` only, with reason `PolicyDenied` and a
/// message that starts with `prefix`; returns the message.
fn the_only_refusal<'a>(
    refused: &'a BTreeMap<String, Refusal>,
    name: &str,
    prefix: &str,
) -> &'a str {
    assert_eq!(refused.keys().collect::<Vec<_>>(), [name]);
    let r = &refused[name];
    assert_eq!(r.reason, Reason::PolicyDenied);
    assert!(r.message.starts_with(prefix), "{}", r.message);
    &r.message
}

#[test]
fn hooks_that_break_pod_security_are_refused_by_the_dry_run_of_the_hooked_pod() {
    let [good, bad] = labelling_and_adding_a_container("bad", "sidecar", "sneaky");
    // The API server's Pod Security admission refuses pods that run `sneaky`.
    let fake = Fake::new(vec!["sneaky"]);
    let verdicts = Verdicts::default();
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    let message = the_only_refusal(
        &refused,
        "bad",
        "spec.hooks[0] (sidecar) change the vCluster's pods",
    );
    assert!(message.contains("\"restricted:latest\""), "{message}");
    // The hooked pod of both, the pod without hooks, the first step (`bad` hooks first, by
    // name), which violates; then the hooked pod of `good` alone.
    assert_eq!(fake.calls(), (0, 4));
    // Judged once for the same hooks and workload.
    let again = hook_refusals(&verdicts, &fake, &[&bad, &good]);
    assert_eq!(again, refused);
    assert_eq!(fake.calls(), (0, 4));
}

#[test]
fn a_pod_security_violation_of_the_unhooked_pod_is_not_the_hooks_doing() {
    let hooked = pod_hook(plugin("env", 1), "env", "/spec/containers/0/env", json!([]));
    // Pod Security refuses the representative pod itself (its container is `workload`).
    let fake = Fake::new(vec!["workload"]);
    let refused = hook_refusals(&Verdicts::default(), &fake, &[&hooked]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 2));
}

/// The fourth attacker's finding 6: a hook that makes the representative pod invalid (its
/// copy of a label into `seccompProfile.type`, say) is refused by the API server's validation,
/// which runs before Pod Security admission; that was counted as a pass, so the namespace's
/// level never judged what the hook does to real pods. Now it refuses the plugin whose hook
/// did it, unless the pod without hooks is refused too.
#[test]
fn hooks_that_make_the_pod_invalid_are_refused_as_unjudgeable() {
    let [good, odd] = labelling_and_adding_a_container("odd", "odd", "odd");
    let fake = Fake::refusing_as_invalid(vec!["odd"]);
    let refused = hook_refusals(&Verdicts::default(), &fake, &[&good, &odd]);
    let message = the_only_refusal(
        &refused,
        "odd",
        "spec.hooks[0] (odd) make a representative pod of the vCluster invalid, so the Pod Security level of namespace team-a cannot judge",
    );
    assert!(message.contains("Unsupported value"), "{message}");
    // The hooked pod of both, the pod without hooks, the first step (`odd` adds a container on
    // `CreatePhysical`, so it runs the v2 way and its hooks run first, before `good`'s: refused),
    // then the hooked pod of `good` alone.
    assert_eq!(fake.calls(), (0, 4));

    // A pod the API server refuses without any hook is not the hooks' doing.
    let fake = Fake::refusing_as_invalid(vec!["workload"]);
    let refused = hook_refusals(&Verdicts::default(), &fake, &[&good]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 2));
}

/// The security review's F6: a dry run of the hooked pod that the API server answers with an
/// error that judges nothing (a pod quota's 403, a 500, a webhook's timeout) lets the hooks
/// pass, but the verdict is not remembered: the next call asks again, and the namespace's
/// level judges the hooks as soon as the API server answers. An admitted pod's verdict is
/// remembered.
#[test]
fn an_unjudged_pod_admits_the_hooks_but_is_asked_again() {
    let [good, bad] = labelling_and_adding_a_container("bad", "sidecar", "sneaky");

    // Admitted: remembered, no second dry run.
    let fake = Fake::new(vec![]);
    let verdicts = Verdicts::default();
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 1));
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 1));
    assert_eq!(verdicts.entries(), (0, 1));

    // Pod Security would refuse `sneaky`, but the API server judges no pod now: the hooks
    // pass (fail-open), and the next call dry-runs again.
    let fake = Fake::new(vec!["sneaky"]);
    fake.unjudged.store(true, Ordering::SeqCst);
    let verdicts = Verdicts::default();
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 1));
    assert_eq!(verdicts.entries(), (0, 0));
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fake.calls(), (0, 2));

    // The API server judges again: `bad` is refused (the hooked pod of both, the pod without
    // hooks, the first step, the hooked pod of `good` alone), and that is remembered.
    fake.unjudged.store(false, Ordering::SeqCst);
    let refused = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    the_only_refusal(
        &refused,
        "bad",
        "spec.hooks[0] (sidecar) change the vCluster's pods",
    );
    assert_eq!(fake.calls(), (0, 6));
    let again = hook_refusals(&verdicts, &fake, &[&good, &bad]);
    assert_eq!(again, refused);
    assert_eq!(fake.calls(), (0, 6));
}

#[test]
fn plugins_without_hooks_cost_no_dry_run() {
    let fake = Fake::new(vec![]);
    let refused = hook_refusals(&Verdicts::default(), &fake, &[&plugin("a", 1)]);
    assert!(refused.is_empty());
    assert_eq!(fake.calls(), (0, 0));
}
