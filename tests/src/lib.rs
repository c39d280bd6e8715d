#![warn(missing_docs)]
//! Test support: real `etcd` and `kube-apiserver` processes for the end-to-end suite.
//!
//! [`ControlPlane`] drives `scripts/control-plane` (the same steps the demo uses): the binaries
//! are built once from their pinned Go modules and cached outside the repo; each test binary
//! starts one etcd and two API servers, the **host** cluster and the **virtual** cluster (the
//! vCluster's own control plane), on free 127.0.0.1 ports, RBAC on, with static-token
//! identities ([`Identity`]). Tests share that control plane and keep apart by namespace.
//!
//! Stopping: an owned [`ControlPlane`] stops on drop, also when a test panics. The shared one
//! lives in a static, which Rust never drops, so `up` is also given the test binary's pid: a
//! watchdog stops the processes once the binary has exited, however it ended. Their state
//! folders (`$TMPDIR/vcp-control-plane-<pid>-<n>`: logs, audit log, kubeconfigs) outlive the
//! binary so a failure can be read afterwards; [`ControlPlane::start`] removes those of test
//! binaries that are no longer running.
//!
//! Modules: [`admission`] (the trust model's admission policies and tenant identities),
//! [`argocd`] (Argo CD's health of a VClusterPlugin, in the engine Argo CD embeds),
//! [`argocd_local`] (Argo CD's controller and repo server as local processes, with Redis, a Git
//! remote and a Helm repository on loopback),
//! [`control_plane`] (the processes and clients), [`audit`] (who wrote what, from the
//! audit logs), [`fixtures`] (vCluster's chart rendered by helm, CRDs, namespaces, YAML), [`plugins`] (the
//! shared operator and `VClusterPlugin` helpers), [`process`] (the workspace's binaries as
//! processes: the operator binary a test can kill), [`proxy`] (a TCP proxy a test can pause:
//! a network partition), [`wait`] (polling until a condition holds), [`runtime`] (the
//! declarative runtime in-process, and the `World` of a runtime test), [`replica`]
//! (an operator replica in-process that a test can stop or kill), [`logs`] (the
//! process's own warnings, captured), [`workload`] (a vCluster's
//! workload of either kind, as its chart renders it), [`vcluster_syncer`] (vCluster's own
//! syncer as a local process, with the virtual API server as its control plane).
//! Their items are re-exported at the crate root.
//!
//! [`cert_manager`] runs the real cert-manager's controllers on the host (a driver built from
//! its Go module), [`cert_manager_scenario`] is the cert-manager story of the end-to-end tests; [`real_crds`] installs real controllers' CRDs from their modules' files;
//! [`oracle`] asks vCluster's translate oracle for expected host names and selectors.
//!
//! [`cpu`] reads the CPU time of a bench's processes from `/proc`; [`plot`] draws the benches'
//! plots; [`bench`] repeats a bench (`BENCH_RUNS`) and prints the medians of its figures.
//!
//! [`image`] builds the container image without a container engine: it replays the Dockerfile.
//!
//! [`node`] is a real one-node cluster (`scripts/node`: kubelet, containerd, kube-proxy), where
//! pods run from images built locally with buildah: the `cluster` tests.

pub mod admission;
pub mod argocd;
pub mod argocd_local;
pub mod audit;
pub mod bench;
pub mod cert_manager;
pub mod cert_manager_scenario;
pub mod control_plane;
pub mod cpu;
pub mod fixtures;
pub mod image;
pub mod logs;
pub mod node;
pub mod oracle;
pub mod plot;
pub mod plugins;
pub mod process;
pub mod proxy;
pub mod real_crds;
pub mod replica;
pub mod runtime;
pub mod vcluster_syncer;
pub mod wait;
pub mod workload;

pub use admission::{
    ADMISSION_OVERLAY, TENANT_RBAC, bind_tenant_rights, install_admission_policies,
};
pub use audit::{
    AUDIT_CATCH_UP_TIMEOUT, Audit, AuditedRead, AuditedWrite, Writes, audit_caught_up,
    audit_caught_up_in, audited_read_events, audited_reads, audited_requests, audited_write_events,
    audited_writes,
};
pub use cert_manager::{
    CertManager, cert_manager_resource, condition_status, tls_dns_names, tls_signed_by,
};
pub use control_plane::{Cluster, ControlPlane, Identity, config_from, repo_root};
pub use fixtures::{
    RESTRICTED_VALUES, TEST_FIELD_MANAGER, VCLUSTER_VERSIONS, apply_yaml, apply_yaml_file,
    create_namespace, create_yaml, install_crds, install_operator_rbac, oracle_path_at,
    oracle_paths, refusal, render_vcluster_chart, render_vcluster_chart_from, string_map,
    vcluster_workload, vcluster_workload_with,
};
pub use oracle::{
    json_lines_oracle, kubernetes_plurals, translate_oracle, translate_oracle_at,
    vcluster_host_label_selector, vcluster_host_name,
};
pub use plugins::{
    ACCEPTING_FIELD_MANAGER, accept_as_operator, condition, create_plugin, delete_plugin,
    install_operator_role, operator_reconciles, operator_telemetry, poke_plugin, poll_event,
    poll_event_where, poll_ready, prepare_operator_host, start_shared_operator,
    start_shared_operator_with_policy, wait_event, wait_operator_reconciled, wait_ready,
};
pub use process::{
    OperatorOptions, OperatorProcess, exit_signal, http_get, metric, metric_sum, tail_of_output,
    workspace_binary, workspace_example,
};
pub use proxy::{TcpProxy, kubeconfig_server};
pub use real_crds::{
    cert_manager_crd_files, gateway_api_crd_file, install_crd_files, service_monitor_crd_file,
};
pub use replica::Replica;
pub use runtime::{Runtime, World, start_runtime};
pub use vcluster_syncer::{
    VCLUSTER_RELEASE, VClusterSyncer, install_vcluster_chart, install_vcluster_chart_from,
    process_runs,
};
pub use wait::{poll_for, wait_for};
