use super::*;
use crate::policy::Policy;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, EnvFromSource, EnvVar, EnvVarSource, SELinuxOptions,
    SeccompProfile, SecretEnvSource, SecretKeySelector, VolumeMount,
};
use vcp_crds::{VClusterPluginSpec, VClusterRef};

fn plugin(f: impl FnOnce(&mut VClusterPluginSpec)) -> VClusterPlugin {
    let mut spec = VClusterPluginSpec {
        vcluster: VClusterRef { name: "vc".into() },
        ..Default::default()
    };
    f(&mut spec);
    let mut p = VClusterPlugin::new("p", spec);
    p.metadata.namespace = Some("ns".into());
    p
}

fn with_sc(sc: SecurityContext) -> VClusterPlugin {
    plugin(|s| s.security_context = Some(sc))
}

/// The `Ready` message of `p` under the default policy.
fn refused(p: &VClusterPlugin) -> String {
    check(&ContainerPolicy::default(), p)
        .expect_err("refused by default")
        .message()
}

fn secret_ref(name: &str) -> EnvVar {
    EnvVar {
        name: "PASSWORD".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: name.into(),
                key: "password".into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_from_secret(name: &str) -> EnvFromSource {
    EnvFromSource {
        secret_ref: Some(SecretEnvSource {
            name: name.into(),
            optional: None,
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

// Expected messages: the module docs' table (field path, value, policy key).

#[test]
fn privileged_is_refused() {
    let p = with_sc(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    assert_eq!(
        refused(&p),
        "spec.securityContext.privileged = true is refused by the operator policy: a privileged container has full access to the node (policy containers.allowPrivileged: false)"
    );
    let allow = ContainerPolicy {
        allow_privileged: true,
        ..Default::default()
    };
    assert_eq!(check(&allow, &p), Ok(()));
    let off = with_sc(SecurityContext {
        privileged: Some(false),
        ..Default::default()
    });
    assert_eq!(check(&ContainerPolicy::default(), &off), Ok(()));
}

#[test]
fn privilege_escalation_is_refused_only_when_asked_for() {
    let p = with_sc(SecurityContext {
        allow_privilege_escalation: Some(true),
        ..Default::default()
    });
    assert_eq!(
        refused(&p),
        "spec.securityContext.allowPrivilegeEscalation = true is refused by the operator policy: a process of the container could gain more privileges than its parent (policy containers.allowPrivilegeEscalation: false)"
    );
    let allow = ContainerPolicy {
        allow_privilege_escalation: true,
        ..Default::default()
    };
    assert_eq!(check(&allow, &p), Ok(()));
    let off = with_sc(SecurityContext {
        allow_privilege_escalation: Some(false),
        ..Default::default()
    });
    assert_eq!(check(&ContainerPolicy::default(), &off), Ok(()));
}

#[test]
fn added_capabilities_are_refused_unless_listed() {
    let caps = |add: &[&str]| {
        with_sc(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(add.iter().map(|s| s.to_string()).collect()),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        })
    };
    assert_eq!(
        refused(&caps(&["NET_ADMIN"])),
        "spec.securityContext.capabilities.add[0] = \"NET_ADMIN\" is refused by the operator policy: an added Linux capability (policy containers.allowedCapabilities: [])"
    );
    let allow = ContainerPolicy {
        allowed_capabilities: vec!["NET_BIND_SERVICE".into()],
        ..Default::default()
    };
    assert_eq!(check(&allow, &caps(&["cap_net_bind_service"])), Ok(()));
    let d = check(&allow, &caps(&["NET_BIND_SERVICE", "ALL"])).unwrap_err();
    assert_eq!(d.source, "spec.securityContext.capabilities.add[1]");
    assert!(
        d.reason
            .ends_with("(policy containers.allowedCapabilities: [NET_BIND_SERVICE])"),
        "{d:?}"
    );
    // Dropping is always fine.
    let drop_only = with_sc(SecurityContext {
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        ..Default::default()
    });
    assert_eq!(check(&ContainerPolicy::default(), &drop_only), Ok(()));
}

#[test]
fn asking_for_root_is_refused() {
    let user0 = with_sc(SecurityContext {
        run_as_user: Some(0),
        ..Default::default()
    });
    assert_eq!(
        refused(&user0),
        "spec.securityContext.runAsUser = 0 is refused by the operator policy: running as root (policy containers.allowRunAsRoot: false)"
    );
    let group0 = with_sc(SecurityContext {
        run_as_group: Some(0),
        ..Default::default()
    });
    assert_eq!(
        refused(&group0),
        "spec.securityContext.runAsGroup = 0 is refused by the operator policy: running as root (policy containers.allowRunAsRoot: false)"
    );
    let not_non_root = with_sc(SecurityContext {
        run_as_non_root: Some(false),
        ..Default::default()
    });
    assert_eq!(
        refused(&not_non_root),
        "spec.securityContext.runAsNonRoot = false is refused by the operator policy: it would let the container run as root, overriding the pod's runAsNonRoot (policy containers.allowRunAsRoot: false)"
    );
    let allow = ContainerPolicy {
        allow_run_as_root: true,
        ..Default::default()
    };
    for p in [&user0, &group0, &not_non_root] {
        assert_eq!(check(&allow, p), Ok(()));
    }
    let non_root = with_sc(SecurityContext {
        run_as_user: Some(1000),
        run_as_group: Some(1000),
        run_as_non_root: Some(true),
        ..Default::default()
    });
    assert_eq!(check(&ContainerPolicy::default(), &non_root), Ok(()));
}

#[test]
fn unconfined_profiles_are_refused() {
    let seccomp = with_sc(SecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    });
    assert_eq!(
        refused(&seccomp),
        "spec.securityContext.seccompProfile.type = \"Unconfined\" is refused by the operator policy: a container without the runtime's confinement (policy containers.allowUnconfined: false)"
    );
    let apparmor = with_sc(SecurityContext {
        app_armor_profile: Some(AppArmorProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    });
    assert!(
        refused(&apparmor)
            .starts_with("spec.securityContext.appArmorProfile.type = \"Unconfined\"")
    );
    let proc_mount = with_sc(SecurityContext {
        proc_mount: Some("Unmasked".into()),
        ..Default::default()
    });
    assert!(refused(&proc_mount).starts_with("spec.securityContext.procMount = \"Unmasked\""));
    let selinux = with_sc(SecurityContext {
        se_linux_options: Some(SELinuxOptions {
            type_: Some("spc_t".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(
        refused(&selinux),
        "spec.securityContext.seLinuxOptions = {...} is refused by the operator policy: a custom SELinux label (policy containers.allowUnconfined: false)"
    );
    let default_profile = with_sc(SecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        proc_mount: Some("Default".into()),
        ..Default::default()
    });
    assert_eq!(check(&ContainerPolicy::default(), &default_profile), Ok(()));
    let allow = ContainerPolicy {
        allow_unconfined: true,
        ..Default::default()
    };
    for p in [&seccomp, &apparmor, &proc_mount, &selinux] {
        assert_eq!(check(&allow, p), Ok(()));
    }
}

#[test]
fn secret_key_refs_in_env_are_refused() {
    let p = plugin(|s| {
        s.env = Some(vec![
            EnvVar {
                name: "LOG".into(),
                value: Some("debug".into()),
                ..Default::default()
            },
            secret_ref("db"),
        ])
    });
    assert_eq!(
        refused(&p),
        "spec.env[1].valueFrom.secretKeyRef = {name: \"db\", key: \"password\"} is refused by the operator policy: a reference to Secret \"db\" (policy containers.allowSecretReferences: false, containers.allowedSecrets: [])"
    );
}

#[test]
fn secret_refs_in_env_from_are_refused() {
    let p = plugin(|s| s.env_from = Some(vec![env_from_secret("vc-my-vcluster")]));
    assert_eq!(
        refused(&p),
        "spec.envFrom[0].secretRef = {name: \"vc-my-vcluster\"} is refused by the operator policy: a reference to Secret \"vc-my-vcluster\" (policy containers.allowSecretReferences: false, containers.allowedSecrets: [])"
    );
}

#[test]
fn allowed_secrets_by_name_prefix_or_all() {
    let p = plugin(|s| {
        s.env = Some(vec![secret_ref("plugin-creds-a")]);
        s.env_from = Some(vec![env_from_secret("token")]);
    });
    let by_name = ContainerPolicy {
        allowed_secrets: vec!["plugin-creds-*".into(), "token".into()],
        ..Default::default()
    };
    assert_eq!(check(&by_name, &p), Ok(()));
    let only_prefix = ContainerPolicy {
        allowed_secrets: vec!["plugin-creds-*".into()],
        ..Default::default()
    };
    let d = check(&only_prefix, &p).unwrap_err();
    assert_eq!(d.source, "spec.envFrom[0].secretRef");
    assert!(
        d.reason
            .ends_with("containers.allowedSecrets: [plugin-creds-*])"),
        "{d:?}"
    );
    let all = ContainerPolicy {
        allow_secret_references: true,
        ..Default::default()
    };
    assert_eq!(check(&all, &p), Ok(()));
    // ConfigMap references are no Secret references.
    let cm = plugin(|s| {
        s.env_from = Some(vec![EnvFromSource {
            config_map_ref: Some(k8s_openapi::api::core::v1::ConfigMapEnvSource {
                name: "settings".into(),
                optional: None,
            }),
            ..Default::default()
        }])
    });
    assert_eq!(check(&ContainerPolicy::default(), &cm), Ok(()));
}

#[test]
fn mounts_of_the_vclusters_volumes_are_refused() {
    let p = plugin(|s| s.volume_mounts = Some(vec![mount("data", "/data")]));
    assert_eq!(
        refused(&p),
        "spec.volumeMounts[0].name = \"data\" is refused by the operator policy: a mount of the vCluster's volume \"data\", which vcluster-plugin-operator did not add (policy containers.allowedVolumes: [])"
    );
    let allow = ContainerPolicy {
        allowed_volumes: vec!["data".into()],
        ..Default::default()
    };
    assert_eq!(check(&allow, &p), Ok(()));
}

/// An attack: `plugins` (the emptyDir of the v2 plugins' binaries, which
/// vCluster's syncer runs) is mounted by the operator's v2 init containers and `syncer` only:
/// refused for every plugin, whatever `allowedVolumes` says.
#[test]
fn a_mount_of_the_plugins_volume_is_refused_whatever_the_policy() {
    let p = plugin(|s| s.volume_mounts = Some(vec![mount("plugins", "/usr/local/bin")]));
    let expected = "spec.volumeMounts[0].name = \"plugins\" is refused by the operator policy: a mount of the v2 plugins' binaries, which vCluster's syncer runs: vcluster-plugin-operator mounts it into its own v2 init containers and the syncer only (no policy key allows it)";
    assert_eq!(refused(&p), expected);
    let everything = ContainerPolicy {
        allowed_volumes: vec!["plugins".into()],
        ..Default::default()
    };
    assert_eq!(
        check(&everything, &p).map_err(|d| d.message()),
        Err(expected.to_string())
    );
}

/// The vCluster's admin kubeconfig (`vcp-vcluster-kubeconfig`, Secret
/// `vc-<vcluster>`) is the operator's runtime's alone: refused for every plugin, whatever
/// `allowedVolumes` says.
#[test]
fn a_mount_of_the_vcluster_kubeconfig_is_refused_whatever_the_policy() {
    let p = plugin(|s| s.volume_mounts = Some(vec![mount("vcp-vcluster-kubeconfig", "/steal")]));
    let expected = "spec.volumeMounts[0].name = \"vcp-vcluster-kubeconfig\" is refused by the operator policy: a mount of the vCluster's admin kubeconfig (Secret vc-vc), which vcluster-plugin-operator mounts into its own runtime container only (no policy key allows it)";
    assert_eq!(refused(&p), expected);
    let everything = ContainerPolicy {
        allowed_volumes: vec!["vcp-vcluster-kubeconfig".into(), "data".into()],
        allow_secret_references: true,
        ..Default::default()
    };
    assert_eq!(
        check(&everything, &p).map_err(|d| d.message()),
        Err(expected.to_string())
    );
}

#[test]
fn images_outside_the_allow_list_are_refused() {
    let p = |image: &str| plugin(|s| s.image = Some(image.into()));
    let policy = ContainerPolicy {
        allowed_images: vec![
            "registry.example.com/".into(),
            "ghcr.io/loft-sh/vcluster-example".into(),
        ],
        ..Default::default()
    };
    for ok in [
        "registry.example.com/team/plugin:1",
        "ghcr.io/loft-sh/vcluster-example:0.1.0",
        "ghcr.io/loft-sh/vcluster-example@sha256:0123",
        "ghcr.io/loft-sh/vcluster-example",
    ] {
        assert_eq!(check(&policy, &p(ok)), Ok(()), "{ok}");
    }
    for bad in [
        "ghcr.io/loft-sh/vcluster-example-evil:1",
        "registry.example.com.evil.io/x:1",
        "docker.io/library/busybox",
    ] {
        let d = check(&policy, &p(bad)).unwrap_err();
        assert_eq!(
            d.message(),
            format!(
                "spec.image = {bad:?} is refused by the operator policy: an image from outside the allowed registries (policy containers.allowedImages: [registry.example.com/, ghcr.io/loft-sh/vcluster-example])"
            )
        );
    }
    // No list: any image.
    assert_eq!(check(&ContainerPolicy::default(), &p("anything:1")), Ok(()));
    // The embedded runtime (no image) is the operator's own.
    assert_eq!(check(&policy, &plugin(|_| {})), Ok(()));
}

#[test]
fn a_plain_plugin_passes_and_the_first_refusal_is_reported() {
    assert_eq!(check(&ContainerPolicy::default(), &plugin(|_| {})), Ok(()));
    let p = plugin(|s| {
        s.security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        s.env_from = Some(vec![env_from_secret("db")]);
    });
    assert_eq!(
        check(&ContainerPolicy::default(), &p).unwrap_err().source,
        "spec.securityContext.privileged"
    );
}

#[test]
fn policy_file_keys() {
    let policy = Policy::from_yaml(
        "containers:\n  allowPrivileged: true\n  allowedCapabilities: [NET_ADMIN]\n  allowedSecrets: [db]\n  allowedVolumes: [cache]\n  allowedImages: [ghcr.io/]\n",
    )
    .unwrap();
    assert!(policy.containers.allow_privileged);
    assert!(!policy.containers.allow_run_as_root, "default kept");
    assert_eq!(policy.containers.allowed_secrets, ["db"]);
    assert_eq!(policy.forbidden_verbs, Policy::default().forbidden_verbs);
    let err = Policy::from_yaml("containers:\n  allowPriviledged: true\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("allowPriviledged"), "{err}");
    assert!(err.contains("containers.allowPrivileged"), "{err}");
}

#[test]
fn evaluate_checks_the_containers() {
    let p = with_sc(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let d =
        crate::policy::evaluate(&Policy::default(), &p, &crate::rbac::Plurals::new()).unwrap_err();
    assert_eq!(d.source, "spec.securityContext.privileged");
}

/// `containers.maxResources` bounds what `spec.resources` asks for, requests and limits alike,
/// for every kind of plugin; quantities compare as Kubernetes reads them (`1Gi` = `1024Mi`).
#[test]
fn resources_above_the_policy_maximum_are_refused() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let asking = |kind: &str, resource: &str, value: &str, image: bool| {
        plugin(|s| {
            let list = Some([(resource.to_string(), Quantity(value.into()))].into());
            s.resources = Some(if kind == "requests" {
                ResourceRequirements {
                    requests: list,
                    ..Default::default()
                }
            } else {
                ResourceRequirements {
                    limits: list,
                    ..Default::default()
                }
            });
            if image {
                s.image = Some("example.com/p:1".into());
            }
        })
    };
    // unset (the default): no bound
    assert!(
        check(
            &ContainerPolicy::default(),
            &asking("limits", "memory", "100Ti", false)
        )
        .is_ok()
    );
    let policy =
        Policy::from_yaml("containers:\n  maxResources:\n    memory: 1Gi\n    cpu: \"2\"\n")
            .unwrap()
            .containers;
    assert!(check(&policy, &asking("limits", "memory", "1024Mi", false)).is_ok());
    assert!(check(&policy, &asking("requests", "cpu", "2000m", true)).is_ok());
    // a resource the policy does not name: no bound
    assert!(
        check(
            &policy,
            &asking("limits", "ephemeral-storage", "100Gi", true)
        )
        .is_ok()
    );
    let d = check(&policy, &asking("limits", "memory", "100Ti", false)).unwrap_err();
    assert_eq!(d.source, "spec.resources.limits.memory");
    assert_eq!(
        d.message(),
        "spec.resources.limits.memory = 100Ti is refused by the operator policy: more memory than a plugin's container may ask for (policy containers.maxResources.memory: 1Gi)"
    );
    let d = check(&policy, &asking("requests", "cpu", "2001m", true)).unwrap_err();
    assert_eq!(d.source, "spec.resources.requests.cpu");
    // a value that is not a quantity is refused when the policy is read
    let err = Policy::from_yaml("containers:\n  maxResources:\n    memory: lots\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("containers.maxResources.memory")
            && err.contains("\"lots\" is not a Kubernetes quantity"),
        "{err}"
    );
}
