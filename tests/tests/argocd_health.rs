//! config/argocd: the VClusterPlugin health check, run by a real Lua 5.1 interpreter (the
//! dialect Argo CD runs) against status fixtures for each outcome; the argocd-cm snippet
//! embeds that same Lua; the example Application ignores the operator's fields on the
//! vCluster's StatefulSet.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vcp_tests::repo_root;

const HEALTH_KEY: &str = "resource.customizations.health.vcp.dev_VClusterPlugin";

fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/argocd")
}

/// A JSON value as a Lua 5.1 table constructor, as Argo CD hands the object to the script
/// (objects → tables keyed by string, arrays → sequences from 1, null → nil).
fn lua_literal(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Null => out.push_str("nil"),
        serde_json::Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        serde_json::Value::Number(n) => out.push_str(&n.to_string()),
        serde_json::Value::String(s) => lua_string(s, out),
        serde_json::Value::Array(items) => {
            out.push('{');
            for item in items {
                lua_literal(item, out);
                out.push_str(", ");
            }
            out.push('}');
        }
        serde_json::Value::Object(map) => {
            out.push('{');
            for (key, item) in map {
                out.push('[');
                lua_string(key, out);
                out.push_str("] = ");
                lua_literal(item, out);
                out.push_str(", ");
            }
            out.push('}');
        }
    }
}

/// A Lua 5.1 string literal: printable ASCII as is, every other byte as `\ddd`.
fn lua_string(s: &str, out: &mut String) {
    out.push('"');
    for byte in s.bytes() {
        match byte {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(byte as char);
            }
            0x20..=0x7e => out.push(byte as char),
            _ => out.push_str(&format!("\\{byte:03}")),
        }
    }
    out.push('"');
}

/// The Lua 5.1 interpreter; scripts/setup installs Debian's `lua5.1`.
fn lua() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("lua5.1"))
            .find(|p| p.is_file())
    });
    found.expect("lua5.1 is not installed: run scripts/setup (apt-get install lua5.1)")
}

/// Runs `health_lua` on the object in `fixture` (YAML) with tests/fixtures/argocd/harness.lua:
/// returns (status, message).
fn run_health_check(health_lua: &Path, fixture: &Path) -> (String, String) {
    let yaml = std::fs::read_to_string(fixture)
        .unwrap_or_else(|e| panic!("read {}: {e}", fixture.display()));
    let object: serde_json::Value =
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("parse {}: {e}", fixture.display()));
    let mut chunk = String::from("return ");
    lua_literal(&object, &mut chunk);
    chunk.push('\n');

    let mut child = Command::new(lua())
        .arg(fixtures().join("harness.lua"))
        .arg(health_lua)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lua5.1");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(chunk.as_bytes())
        .expect("write the object");
    let out = child.wait_with_output().expect("wait for lua5.1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lua5.1 failed on {}: {}{stdout}",
        fixture.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let message = lines.collect::<Vec<_>>().join("\n");
    (status, message)
}

/// (fixture, expected health status, text the message must contain)
const CASES: &[(&str, &str, &str)] = &[
    (
        "no-status.yaml",
        "Progressing",
        "Waiting for vcluster-plugin-operator",
    ),
    (
        "installing.yaml",
        "Progressing",
        "Starting: listing example.loft.sh/v1 Car",
    ),
    (
        "pending-vcluster-not-found.yaml",
        "Progressing",
        "VClusterNotFound: no StatefulSet or Deployment my-vcluster",
    ),
    (
        "generation-lags.yaml",
        "Progressing",
        "observe generation 3 (observed: 2)",
    ),
    (
        "ready-condition-stale.yaml",
        "Progressing",
        "Ready condition is for generation 2, not yet for 3",
    ),
    (
        "terminating.yaml",
        "Progressing",
        "Terminating: removing sidecar car-sync",
    ),
    (
        "ready.yaml",
        "Healthy",
        "Installed: installed into StatefulSet my-vcluster",
    ),
    (
        "failed-conflict.yaml",
        "Degraded",
        "Conflict: container car-sync in StatefulSet my-vcluster belongs to plugin other-plugin",
    ),
    (
        "degraded-runtime.yaml",
        "Degraded",
        "TypeUnavailable: cannot list cars.example.loft.sh in the virtual cluster: forbidden",
    ),
    (
        "runtime-newer-than-ready.yaml",
        "Degraded",
        "HostObjectConflict: 1 object(s) not synced",
    ),
];

#[test]
fn health_lua_gives_each_outcome_on_its_fixture() {
    let health = repo_root().join("config/argocd/health.lua");
    for (fixture, status, message) in CASES {
        let path = fixtures().join(fixture);
        // The fixtures are real VClusterPlugins, as the API server would hand them to Argo CD.
        let yaml = std::fs::read_to_string(&path).expect("read fixture");
        let _: vcp_crds::VClusterPlugin =
            serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{fixture}: {e}"));

        let (got_status, got_message) = run_health_check(&health, &path);
        assert_eq!(&got_status, status, "{fixture}: message {got_message:?}");
        assert!(
            got_message.contains(message),
            "{fixture}: message {got_message:?} lacks {message:?}"
        );
    }

    // Every fixture is a case, and every outcome is covered.
    let mut files: Vec<String> = std::fs::read_dir(fixtures())
        .expect("read fixtures")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut cased: Vec<String> = CASES.iter().map(|c| c.0.to_string()).collect();
    cased.sort();
    assert_eq!(files, cased, "every fixture needs an expected outcome");
    for outcome in ["Healthy", "Progressing", "Degraded"] {
        assert!(CASES.iter().any(|c| c.1 == outcome), "no {outcome} case");
    }
}

#[test]
fn lua_literals_round_trip_awkward_strings() {
    // Quotes, backslashes, newlines and UTF-8 reach the script unchanged.
    let text = "a \"quoted\" \\ path\nnext line — ü";
    let mut chunk = String::from("io.write(");
    lua_string(text, &mut chunk);
    chunk.push(')');
    let out = Command::new(lua())
        .args(["-e", &chunk])
        .output()
        .expect("run lua5.1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);
}

#[test]
fn argocd_cm_snippet_embeds_health_lua_verbatim() {
    let lua = std::fs::read_to_string(repo_root().join("config/argocd/health.lua"))
        .expect("read health.lua");
    let text = std::fs::read_to_string(repo_root().join("config/argocd/argocd-cm.yaml"))
        .expect("read argocd-cm.yaml");
    let cm: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse argocd-cm.yaml");
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(cm["metadata"]["name"].as_str(), Some("argocd-cm"));
    let embedded = cm["data"][HEALTH_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("argocd-cm.yaml has no data.{HEALTH_KEY}"));
    assert!(
        embedded == lua,
        "argocd-cm.yaml's {HEALTH_KEY} differs from config/argocd/health.lua; copy it over"
    );
}

#[test]
fn application_ignores_the_operators_statefulset_fields() {
    let text = std::fs::read_to_string(repo_root().join("config/argocd/application.yaml"))
        .expect("read application.yaml");
    let app: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse application.yaml");
    assert_eq!(app["apiVersion"].as_str(), Some("argoproj.io/v1alpha1"));
    assert_eq!(app["kind"].as_str(), Some("Application"));
    let ignores = app["spec"]["ignoreDifferences"]
        .as_sequence()
        .expect("spec.ignoreDifferences");
    let statefulset = ignores
        .iter()
        .find(|i| i["group"].as_str() == Some("apps") && i["kind"].as_str() == Some("StatefulSet"))
        .expect("an ignoreDifferences entry for apps/StatefulSet");
    let managers: Vec<&str> = statefulset["managedFieldsManagers"]
        .as_sequence()
        .expect("managedFieldsManagers")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert_eq!(managers, [vcp_crds::OPERATOR_FIELD_MANAGER]);
    let options: Vec<&str> = app["spec"]["syncPolicy"]["syncOptions"]
        .as_sequence()
        .expect("syncPolicy.syncOptions")
        .iter()
        .filter_map(|o| o.as_str())
        .collect();
    assert!(
        options.contains(&"RespectIgnoreDifferences=true"),
        "{options:?}"
    );
}
