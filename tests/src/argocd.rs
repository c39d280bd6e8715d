//! Argo CD's reading of a VClusterPlugin: the health check `config/argocd/health.lua` run by
//! gopher-lua with only the libraries Argo CD opens (`tests/argocd-lua`, the engine Argo CD
//! embeds, built by `scripts/oracles build` as `ARGOCD_LUA`), and the health the README's
//! table ("Argo CD", "Status and condition reasons") gives each captured state
//! (`tests/fixtures/argocd`). Shared by `tests/tests/oracle_argocd_health.rs`, which checks the
//! committed fixtures in two engines, and `tests/tests/runtime_argocd_states.rs`, which
//! captures them from the real operator and runtime and checks each capture, recorded or not.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::control_plane::repo_root;
use crate::fixtures::oracle_paths;

/// Each captured fixture of `tests/fixtures/argocd` (file name), the health Argo CD must give
/// it (`Healthy`, `Progressing`, `Degraded`) and a text its message must contain: the README's
/// table, not the script's output.
pub const FIXTURE_HEALTH: &[(&str, &str, &str)] = &[
    ("ready.yaml", "Healthy", "Installed"),
    (
        "degraded-host-object-conflict.yaml",
        "Degraded",
        "HostObjectConflict: 1 object(s) not synced",
    ),
    (
        "degraded-type-unavailable.yaml",
        "Degraded",
        "TypeUnavailable: the CustomResourceDefinition cars.example.loft.sh in the virtual cluster is being deleted",
    ),
    (
        "installing-runtime-updating.yaml",
        "Progressing",
        "RuntimeUpdating: the runtime reports generation 1, not yet 2",
    ),
    (
        "terminating.yaml",
        "Progressing",
        "Terminating: the VClusterPlugin is being deleted",
    ),
    (
        "pending-vcluster-not-found.yaml",
        "Progressing",
        "VClusterNotFound: no StatefulSet or Deployment named my-vcluster",
    ),
    (
        "failed-policy-denied.yaml",
        "Degraded",
        "PolicyDenied: spec.rbac.role.extraRules[0]",
    ),
];

/// The health script Argo CD is configured with: `config/argocd/health.lua`.
pub fn health_lua() -> PathBuf {
    repo_root().join("config/argocd/health.lua")
}

/// Runs `health_lua` on `object` (the VClusterPlugin as JSON, as the API server hands it to
/// Argo CD) in gopher-lua as Argo CD does: returns `(status, message)`. `case` names the
/// object in failures.
///
/// # Panics
/// When the driver cannot be built or run, or the script fails.
pub fn gopher_lua_health(health_lua: &Path, object: &Value, case: &str) -> (String, String) {
    let driver = oracle_paths()
        .get("ARGOCD_LUA")
        .expect("scripts/oracles build prints ARGOCD_LUA");
    let mut child = Command::new(driver)
        .arg(health_lua)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run argocd-lua");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(object.to_string().as_bytes())
        .expect("write the object");
    let out = child.wait_with_output().expect("wait for argocd-lua");
    assert!(
        out.status.success(),
        "gopher-lua failed on {case}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let health: Value = serde_json::from_slice(&out.stdout).expect("argocd-lua prints JSON");
    let text = |k: &str| health[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("message"))
}

/// Checks that Argo CD (config/argocd/health.lua in gopher-lua, [`gopher_lua_health`]) gives
/// the captured fixture `file`, whose content is `object`, the health [`FIXTURE_HEALTH`] says;
/// returns that `(status, message)`.
///
/// # Panics
/// When `file` has no entry in [`FIXTURE_HEALTH`], or the health or message differ.
pub fn assert_fixture_health(file: &str, object: &Value) -> (String, String) {
    let (_, status, message) = FIXTURE_HEALTH
        .iter()
        .find(|(f, _, _)| *f == file)
        .unwrap_or_else(|| panic!("{file} has no expected Argo CD health in FIXTURE_HEALTH"));
    let (got_status, got_message) = gopher_lua_health(&health_lua(), object, file);
    assert_eq!(
        &got_status, status,
        "{file}: Argo CD's health (gopher-lua), message {got_message:?}"
    );
    assert!(
        got_message.contains(message),
        "{file}: Argo CD's message {got_message:?} lacks {message:?}"
    );
    (got_status, got_message)
}
