//! Expected values come from the Pod Security Standards text
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>, Kubernetes 1.34):
//! baseline "Host Namespaces", "HostPath Volumes", "Host Ports", "Sysctls", "HostProcess";
//! restricted "Volume Types".

use super::*;
use k8s_openapi::api::core::v1::Volume;
use serde_json::{Value, json};

fn pod(spec: Value) -> Pod {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}),
    )
    .unwrap()
}

fn base() -> Value {
    json!({
        "serviceAccountName": "vc-workload",
        "automountServiceAccountToken": false,
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        "volumes": [{"name": "token", "projected": {"sources": [{"downwardAPI": {"items": [
            {"path": "token", "fieldRef": {"fieldPath": "metadata.annotations['x']"}}]}}]}}],
    })
}

fn with(path: &str, value: Value) -> Pod {
    let mut spec = base();
    let mut target = &mut spec;
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts[..parts.len() - 1] {
        target = match part.parse::<usize>() {
            Ok(i) => &mut target[i],
            Err(_) => &mut target[*part],
        };
    }
    target[parts[parts.len() - 1]] = value;
    pod(spec)
}

fn refused(after: &Pod) -> Denial {
    check(&ContainerPolicy::default(), &pod(base()), after).unwrap_err()
}

#[test]
fn the_unhooked_pod_passes() {
    check(&ContainerPolicy::default(), &pod(base()), &pod(base())).unwrap();
}

#[test]
fn host_namespaces_are_refused() {
    // PSS baseline, Host Namespaces: spec.hostNetwork, spec.hostPID, spec.hostIPC:
    // "Undefined/nil", "false".
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        let d = refused(&with(field, json!(true)));
        assert_eq!(d.source, format!("spec.{field}"));
        assert_eq!(d.rule, "= true");
        check(
            &ContainerPolicy::default(),
            &pod(base()),
            &with(field, json!(false)),
        )
        .unwrap();
    }
}

#[test]
fn only_the_restricted_volume_types_pass() {
    // PSS restricted, Volume Types: "spec.volumes[*]: Every item in the spec.volumes[*] list
    // must set one of the following fields to a non-null value: spec.volumes[*].configMap,
    // .csi, .downwardAPI, .emptyDir, .ephemeral, .persistentVolumeClaim, .projected, .secret".
    let allowed = [
        json!({"name": "v", "configMap": {"name": "settings"}}),
        json!({"name": "v", "downwardAPI": {"items": []}}),
        json!({"name": "v", "emptyDir": {}}),
        json!({"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
        json!({"name": "v", "projected": {"sources": []}}),
    ];
    for v in allowed {
        let after = with("volumes", json!([v.clone()]));
        check(&ContainerPolicy::default(), &pod(base()), &after)
            .unwrap_or_else(|d| panic!("{v}: {}", d.message()));
    }
    // `csi` is a restricted type too, but a hook may not add an inline one: the operator's own
    // rule (its driver decides what it mounts), not the type's
    let d = refused(&with(
        "volumes",
        json!([{"name": "v", "csi": {"driver": "x"}}]),
    ));
    assert_eq!(d.source, "spec.volumes[0].csi.driver");
    // PSS baseline, HostPath Volumes: spec.volumes[*].hostPath "Undefined/nil"; and types
    // outside the restricted list.
    for (v, kind) in [
        (
            json!({"name": "root", "hostPath": {"path": "/"}}),
            "hostPath",
        ),
        (
            json!({"name": "n", "nfs": {"server": "s", "path": "/"}}),
            "nfs",
        ),
        (
            json!({"name": "g", "gitRepo": {"repository": "r"}}),
            "gitRepo",
        ),
        (
            json!({"name": "i", "iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0}}),
            "iscsi",
        ),
    ] {
        let d = refused(&with("volumes", json!([v])));
        assert_eq!(d.source, format!("spec.volumes[0].{kind}"));
    }
}

#[test]
fn host_claims_tokens_and_secrets_added_by_hooks_are_refused() {
    let d = refused(&with(
        "volumes",
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-my-vcluster-0"}}]),
    ));
    assert_eq!(d.source, "spec.volumes[0].persistentVolumeClaim.claimName");
    // A claim the pod had already is not the hook's doing.
    let had = with(
        "volumes",
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "mine"}}]),
    );
    check(&ContainerPolicy::default(), &had, &had).unwrap();

    let d = refused(&with(
        "volumes",
        json!([{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]),
    ));
    assert_eq!(
        d.source,
        "spec.volumes[0].projected.sources[0].serviceAccountToken"
    );

    let kubeconfig = json!([{"name": "k", "secret": {"secretName": "vc-my-vcluster"}}]);
    let d = refused(&with("volumes", kubeconfig.clone()));
    assert_eq!(d.source, "spec.volumes[0].secret.secretName");
    assert!(
        d.reason.contains("containers.allowedSecrets"),
        "{}",
        d.reason
    );
    let policy = ContainerPolicy {
        allowed_secrets: vec!["vc-*".into()],
        ..Default::default()
    };
    check(&policy, &pod(base()), &with("volumes", kubeconfig)).unwrap();
    let d = refused(&with(
        "volumes",
        json!([{"name": "p", "projected": {"sources": [{"secret": {"name": "db-credentials"}}]}}]),
    ));
    assert_eq!(d.source, "spec.volumes[0].projected.sources[0].secret.name");
}

#[test]
fn only_the_safe_sysctls_pass() {
    // PSS baseline, Sysctls: "spec.securityContext.sysctls[*].name" allowed values.
    let safe = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    ];
    for name in safe {
        let after = with(
            "securityContext",
            json!({"sysctls": [{"name": name, "value": "1"}]}),
        );
        check(&ContainerPolicy::default(), &pod(base()), &after).unwrap();
    }
    for name in [
        "kernel.msgmax",
        "net.core.somaxconn",
        "vm.overcommit_memory",
    ] {
        let d = refused(&with(
            "securityContext",
            json!({"sysctls": [{"name": name, "value": "1"}]}),
        ));
        assert_eq!(d.source, "spec.securityContext.sysctls[0].name");
    }
}

#[test]
fn host_ports_and_host_process_are_refused() {
    // PSS baseline, Host Ports: spec.containers[*].ports[*].hostPort "Undefined/nil", "0".
    let d = refused(&with(
        "containers/0/ports",
        json!([{"containerPort": 80, "hostPort": 80}]),
    ));
    assert_eq!(d.source, "spec.containers[0].ports[0].hostPort");
    let zero = with(
        "containers/0/ports",
        json!([{"containerPort": 80, "hostPort": 0}]),
    );
    check(&ContainerPolicy::default(), &pod(base()), &zero).unwrap();
    // PSS baseline, HostProcess: windowsOptions.hostProcess "Undefined/nil", "false".
    let d = refused(&with(
        "securityContext",
        json!({"windowsOptions": {"hostProcess": true}}),
    ));
    assert_eq!(d.source, "spec.securityContext.windowsOptions.hostProcess");
    let d = refused(&with(
        "containers/0/securityContext",
        json!({"windowsOptions": {"hostProcess": true}}),
    ));
    assert_eq!(
        d.source,
        "spec.containers[0].securityContext.windowsOptions.hostProcess"
    );
}

/// The seventh security review: a Windows identity (a group-managed service account, or the
/// container's user) written by a hook, on the pod or on a container; Pod Security judges
/// none of these.
#[test]
fn a_windows_identity_may_not_be_written() {
    for (field, value) in [
        ("gmsaCredentialSpecName", json!("ad-admins")),
        (
            "gmsaCredentialSpec",
            json!("{\"ActiveDirectoryConfig\":{}}"),
        ),
        ("runAsUserName", json!("ContainerAdministrator")),
    ] {
        for at in ["securityContext", "containers/0/securityContext"] {
            let d = refused(&with(at, json!({"windowsOptions": {field: value.clone()}})));
            let prefix = if at == "securityContext" {
                "spec"
            } else {
                "spec.containers[0]"
            };
            assert_eq!(
                d.source,
                format!("{prefix}.securityContext.windowsOptions.{field}")
            );
            assert!(d.reason.contains("Windows identity"), "{}", d.message());
        }
    }
}

/// The seventh security review: a volume with a restricted source beside a host one is judged
/// by every source, not by the first.
#[test]
fn every_source_of_a_volume_is_judged() {
    let d = refused(&with(
        "volumes",
        json!([{"name": "two", "configMap": {"name": "x"}, "hostPath": {"path": "/"}}]),
    ));
    assert_eq!(d.source, "spec.volumes[0].hostPath");
}

#[test]
fn node_identity_and_runtime_may_not_change() {
    for (field, value) in [
        ("nodeName", json!("node-1")),
        ("serviceAccountName", json!("vc-my-vcluster")),
        ("serviceAccount", json!("vc-my-vcluster")),
        ("runtimeClassName", json!("runc")),
        ("automountServiceAccountToken", json!(true)),
        // Unset means true (the API's default).
        ("automountServiceAccountToken", Value::Null),
    ] {
        let d = refused(&with(field, value.clone()));
        assert_eq!(d.source, format!("spec.{field}"), "{field}: {value}");
    }
}

/// The security review's finding F4: the fields that choose a pod's node, refused on any
/// change as `nodeName` is.
#[test]
fn scheduling_fields_may_not_change() {
    for (field, value) in [
        (
            "nodeSelector",
            json!({"node-role.kubernetes.io/control-plane": ""}),
        ),
        (
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]}]}}}),
        ),
        ("tolerations", json!([{"operator": "Exists"}])),
        (
            "topologySpreadConstraints",
            json!([{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]),
        ),
        ("schedulerName", json!("my-scheduler")),
    ] {
        let d = refused(&with(field, value.clone()));
        assert_eq!(d.source, format!("spec.{field}"), "{field}: {value}");
        assert!(
            d.reason
                .contains(&format!("a hook may not write spec.{field}")),
            "{}",
            d.message()
        );
        // taken away is a change too
        let had = with(field, value.clone());
        let d = check(&ContainerPolicy::default(), &had, &pod(base())).unwrap_err();
        assert_eq!(d.source, format!("spec.{field}"), "{field} removed");
        assert_eq!(d.rule, "= absent");
        // and kept is none
        check(&ContainerPolicy::default(), &had, &had).unwrap();
    }
    let d = refused(&with("tolerations", json!([{"operator": "Exists"}])));
    assert_eq!(d.rule, r#"= [{"operator":"Exists"}]"#);
}

#[test]
fn every_container_kind_is_judged_by_the_container_policy() {
    // PSS baseline, Privileged Containers: securityContext.privileged "Undefined/nil", "false",
    // for spec.containers, spec.initContainers and spec.ephemeralContainers.
    let privileged = json!({"privileged": true});
    let d = refused(&with("containers/0/securityContext", privileged.clone()));
    assert_eq!(d.source, "spec.containers[0].securityContext.privileged");
    let d = refused(&with(
        "initContainers",
        json!([{"name": "i", "image": "x", "securityContext": privileged.clone()}]),
    ));
    assert_eq!(
        d.source,
        "spec.initContainers[0].securityContext.privileged"
    );
    let d = refused(&with(
        "ephemeralContainers",
        json!([{"name": "e", "image": "x", "securityContext": privileged}]),
    ));
    assert_eq!(
        d.source,
        "spec.ephemeralContainers[0].securityContext.privileged"
    );
    let d = refused(&with(
        "containers/0/securityContext",
        json!({"capabilities": {"add": ["SYS_ADMIN"]}}),
    ));
    assert_eq!(
        d.source,
        "spec.containers[0].securityContext.capabilities.add[0]"
    );
    let d = refused(&with(
        "containers/0/env",
        json!([{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db-credentials", "key": "password"}}}]),
    ));
    assert_eq!(d.source, "spec.containers[0].env[0].valueFrom.secretKeyRef");
    // The pod's own securityContext: runAsUser 0 (the container policy's allowRunAsRoot).
    let d = refused(&with("securityContext", json!({"runAsUser": 0})));
    assert_eq!(d.source, "spec.securityContext.runAsUser");
    let d = refused(&with(
        "securityContext",
        json!({"seccompProfile": {"type": "Unconfined"}}),
    ));
    assert_eq!(d.source, "spec.securityContext.seccompProfile.type");
}

#[test]
fn images_are_judged_where_the_hooks_changed_them() {
    let policy = ContainerPolicy {
        allowed_images: vec!["ghcr.io/trusted/".into()],
        ..Default::default()
    };
    // The vCluster's own image is not the hook's doing.
    check(&policy, &pod(base()), &pod(base())).unwrap();
    let d = check(
        &policy,
        &pod(base()),
        &with("containers/0/image", json!("evil.example.com/miner:1")),
    )
    .unwrap_err();
    assert_eq!(d.source, "spec.containers[0].image");
}

#[test]
fn volume_types_are_read_from_the_one_field_set() {
    let v: Volume =
        serde_json::from_value(json!({"name": "x", "hostPath": {"path": "/"}})).unwrap();
    assert_eq!(volume_type(&v), "hostPath");
}

#[test]
fn lost_keys_finds_fields_the_typed_view_dropped() {
    let hooked = json!({"spec": {"HostNetwork": true, "containers": [{"name": "a", "Image": "x"}], "nodeName": null}});
    let typed =
        serde_json::to_value(serde_json::from_value::<Pod>(hooked.clone()).unwrap()).unwrap();
    assert_eq!(
        lost_keys(&hooked, &typed),
        vec![
            "spec.HostNetwork".to_string(),
            "spec.containers[0].Image".to_string()
        ]
    );
    let fine = json!({"spec": {"hostNetwork": false, "containers": [{"name": "a"}]}});
    let typed = serde_json::to_value(serde_json::from_value::<Pod>(fine.clone()).unwrap()).unwrap();
    assert!(lost_keys(&fine, &typed).is_empty());
}

/// The security review's finding F3, its payload: a `spec` with `automountServiceAccountToken:
/// false` and `automountſerviceAccountToken: null`. The typed view (case-sensitive, unknown
/// keys ignored) reads `false`; Go's encoding/json folds `ſ` (U+017F) to `s`, sets the field
/// from each key in turn and ends with the later one, `null`: the token is mounted.
#[test]
fn keys_go_reads_as_one_field_are_found_and_a_null_under_no_field_is_lost() {
    let long_s = "automount\u{17f}erviceAccountToken";
    let mut hooked =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": base()});
    hooked["spec"][long_s] = Value::Null;
    // serde_json writes the folded key after the field's own spelling
    let text = serde_json::to_string(&hooked).unwrap();
    assert!(text.find("automountServiceAccountToken") < text.find(long_s));
    let typed: Pod = serde_json::from_value(hooked.clone()).unwrap();
    assert_eq!(
        typed.spec.as_ref().unwrap().automount_service_account_token,
        Some(false)
    );
    assert_eq!(
        folded_duplicate_keys(&hooked),
        Some((
            "spec".to_string(),
            "automountServiceAccountToken".to_string(),
            long_s.to_string()
        ))
    );
    let round = serde_json::to_value(&typed).unwrap();
    assert_eq!(lost_keys(&hooked, &round), vec![format!("spec.{long_s}")]);

    // in a nested struct, and by case alone
    let mut nested = json!({"spec": base()});
    nested["spec"]["containers"][0]["securityContext"] =
        json!({"privileged": false, "Privileged": true});
    assert_eq!(
        folded_duplicate_keys(&nested),
        Some((
            "spec.containers[0].securityContext".to_string(),
            "Privileged".to_string(),
            "privileged".to_string()
        ))
    );
    // under a field spelled otherwise (Go reads `Spec` as `spec`, a struct)
    let other = json!({"Spec": {"hostNetwork": false, "HOSTNETWORK": true}});
    assert_eq!(
        folded_duplicate_keys(&other).map(|d| d.0),
        Some("Spec".to_string())
    );

    // Map keys are matched exactly by Go: two keys that fold alike are two keys.
    let mut maps = json!({"metadata": {"labels": {"App": "a", "app": "b"},
        "annotations": {"example.com/x": "1", "example.com/X": "2"}}, "spec": base()});
    maps["spec"]["nodeSelector"] = json!({"Disk": "ssd", "disk": "hdd"});
    maps["spec"]["containers"][0]["resources"] =
        json!({"limits": {"example.com/gpu": "1", "example.com/GPU": "2"}});
    assert_eq!(folded_duplicate_keys(&maps), None);
    assert_eq!(folded_duplicate_keys(&json!({"spec": base()})), None);

    // A null under a field is no key; under a key that is no field, it is lost.
    let fine = json!({"spec": {"nodeName": null, "containers": [{"name": "a", "image": null}]}});
    let round = serde_json::to_value(serde_json::from_value::<Pod>(fine.clone()).unwrap()).unwrap();
    assert!(lost_keys(&fine, &round).is_empty());
    let odd = json!({"spec": {"NodeName": null, "containers": [{"name": "a", "Image": null}]}});
    let round = serde_json::to_value(serde_json::from_value::<Pod>(odd.clone()).unwrap()).unwrap();
    assert_eq!(
        lost_keys(&odd, &round),
        vec![
            "spec.NodeName".to_string(),
            "spec.containers[0].Image".to_string()
        ]
    );
}

/// An attacker's hooks: each passed the judge, and each gave the vCluster's
/// pods what the policy refuses once the API server or a controller acted on it.
#[test]
fn what_the_api_server_or_a_controller_turns_into_access_is_refused() {
    // a clone of the vCluster's data claim, through an ephemeral volume's claim template
    for field in ["dataSource", "dataSourceRef"] {
        let d = refused(&with(
            "volumes",
            json!([{"name": "loot", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                field: {"kind": "PersistentVolumeClaim", "name": "data-my-vcluster-0"}}}}}]),
        ));
        assert_eq!(
            d.source,
            format!("spec.volumes[0].ephemeral.volumeClaimTemplate.spec.{field}")
        );
    }
    // an ephemeral claim of its own (no source) is an empty volume
    check(
        &ContainerPolicy::default(),
        &pod(base()),
        &with(
            "volumes",
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]),
        ),
    )
    .unwrap();
    // an inline CSI volume of any driver
    let d = refused(&with(
        "volumes",
        json!([{"name": "root", "csi": {"driver": "hostpath.csi.k8s.io", "volumeAttributes": {"path": "/"}}}]),
    ));
    assert_eq!(d.source, "spec.volumes[0].csi.driver");
    // AppArmor and seccomp by annotation, which a v1.34 API server turns into the fields
    for key in [
        "container.apparmor.security.beta.kubernetes.io/app",
        "Container.AppArmor.security.beta.kubernetes.io/app",
        "seccomp.security.alpha.kubernetes.io/pod",
        "container.seccomp.security.alpha.kubernetes.io/app",
    ] {
        let mut after = pod(base());
        after.metadata.annotations = Some([(key.to_string(), "unconfined".to_string())].into());
        let d = refused(&after);
        assert_eq!(d.source, format!("metadata.annotations[{key:?}]"));
    }
    let mut annotated = pod(base());
    annotated.metadata.annotations = Some([("team".to_string(), "a".to_string())].into());
    check(&ContainerPolicy::default(), &pod(base()), &annotated).unwrap();
    // placement and the root group
    let d = refused(&with("priorityClassName", json!("system-node-critical")));
    assert_eq!(d.source, "spec.priorityClassName");
    let d = refused(&with("securityContext", json!({"fsGroup": 0})));
    assert_eq!(d.source, "spec.securityContext.fsGroup");
    let d = refused(&with(
        "securityContext",
        json!({"supplementalGroups": [1000, 0]}),
    ));
    assert_eq!(d.source, "spec.securityContext.supplementalGroups[1]");
    check(
        &ContainerPolicy::default(),
        &pod(base()),
        &with("securityContext", json!({"fsGroup": 2000})),
    )
    .unwrap();
}

/// Another attacker's Pod hooks: a certificate of the pod's host identity, pull
/// Secrets the policy does not allow, an existing volume bound by an ephemeral claim, another
/// workload's device claim.
#[test]
fn identity_certificates_pull_secrets_bound_volumes_and_device_claims_are_refused() {
    let d = refused(&with(
        "volumes",
        json!([{"name": "c", "projected": {"sources": [{"podCertificate": {
            "signerName": "example.com/signer", "keyType": "ED25519", "credentialBundlePath": "b"}}]}}]),
    ));
    assert_eq!(
        d.source,
        "spec.volumes[0].projected.sources[0].podCertificate"
    );
    let d = refused(&with(
        "imagePullSecrets",
        json!([{"name": "vc-my-vcluster"}]),
    ));
    assert_eq!(d.source, "spec.imagePullSecrets[0].name");
    assert!(
        d.reason.contains("containers.allowedSecrets"),
        "{}",
        d.reason
    );
    let policy = ContainerPolicy {
        allowed_secrets: vec!["registry-*".into()],
        ..Default::default()
    };
    check(
        &policy,
        &pod(base()),
        &with("imagePullSecrets", json!([{"name": "registry-team-a"}])),
    )
    .unwrap();
    // a pull Secret the pod had already is not the hook's doing
    let had = with("imagePullSecrets", json!([{"name": "mine"}]));
    check(&ContainerPolicy::default(), &had, &had).unwrap();
    for (field, value) in [
        ("volumeName", json!("pv-of-team-b")),
        ("selector", json!({"matchLabels": {"team": "b"}})),
    ] {
        let d = refused(&with(
            "volumes",
            json!([{"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                field: value}}}}]),
        ));
        assert_eq!(
            d.source,
            format!("spec.volumes[0].ephemeral.volumeClaimTemplate.spec.{field}")
        );
    }
    let d = refused(&with(
        "resourceClaims",
        json!([{"name": "gpu", "resourceClaimName": "team-b-gpu"}]),
    ));
    assert_eq!(d.source, "spec.resourceClaims");
}

/// Pod Security baseline, "Host Probes / Lifecycle Hooks" (Kubernetes 1.34): the `host` of a
/// probe's or lifecycle handler's `httpGet` / `tcpSocket` must be undefined or `""` (the
/// kubelet sends them from the node, as an attacker's hooks used).
#[test]
fn probe_and_lifecycle_hosts_are_refused() {
    let container = |extra: Value| {
        let mut c = json!({"name": "app", "image": "registry.k8s.io/pause:3.10"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        with("containers", json!([c]))
    };
    for (extra, field) in [
        (
            json!({"livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80, "path": "/"}}}),
            "spec.containers[0].livenessProbe.httpGet.host",
        ),
        (
            json!({"readinessProbe": {"tcpSocket": {"host": "10.0.0.1", "port": 10250}}}),
            "spec.containers[0].readinessProbe.tcpSocket.host",
        ),
        (
            json!({"startupProbe": {"httpGet": {"host": "localhost", "port": 10248}}}),
            "spec.containers[0].startupProbe.httpGet.host",
        ),
        (
            json!({"lifecycle": {"postStart": {"httpGet": {"host": "10.0.0.1", "port": 2379}}}}),
            "spec.containers[0].lifecycle.postStart.httpGet.host",
        ),
        (
            json!({"lifecycle": {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 6443}}}}),
            "spec.containers[0].lifecycle.preStop.tcpSocket.host",
        ),
    ] {
        let d = refused(&container(extra));
        assert_eq!(d.source, field);
        assert!(d.reason.contains("Host Probes"), "{}", d.reason);
    }
    // without a host (the pod's own IP), or with an empty one, a probe is the pod's own
    check(
        &ContainerPolicy::default(),
        &pod(base()),
        &container(json!({
            "livenessProbe": {"httpGet": {"port": 8080, "path": "/healthz"}},
            "readinessProbe": {"tcpSocket": {"host": "", "port": 8080}},
        })),
    )
    .unwrap();
    // a host the container had before the hooks is not the hooks' doing
    let had = container(json!({"livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}));
    check(&ContainerPolicy::default(), &had, &had).unwrap();
}
