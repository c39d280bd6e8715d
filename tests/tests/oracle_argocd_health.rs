//! config/argocd: the VClusterPlugin health check, run by a real Lua 5.1 interpreter (the
//! dialect) and by gopher-lua with only the libraries Argo CD opens (the engine Argo CD embeds,
//! tests/argocd-lua) against the statuses the real operator and runtime wrote
//! (tests/fixtures/argocd, captured by tests/tests/runtime_argocd_states.rs) and the transient
//! states made from them; the expected health is the README's table. The argocd-cm snippet
//! embeds that same Lua; the example Application ignores the operator's fields on the
//! vCluster's StatefulSet.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
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

/// Runs `health_lua` on `object` with Lua 5.1 and tests/fixtures/argocd/harness.lua:
/// returns (status, message).
fn run_lua51(health_lua: &Path, object: &Value, case: &str) -> (String, String) {
    let mut chunk = String::from("return ");
    lua_literal(object, &mut chunk);
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
        "lua5.1 failed on {case}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let message = lines.collect::<Vec<_>>().join("\n");
    (status, message)
}

/// A captured fixture (tests/tests/runtime_argocd_states.rs writes them from the real operator and
/// runtime) as the JSON object Argo CD reads.
fn captured(file: &str) -> Value {
    let path = fixtures().join(file);
    let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {file}: {e}"));
    // A real VClusterPlugin, as the API server would hand it to Argo CD.
    let _: vcp_crds::VClusterPlugin =
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn condition_of(object: &Value, type_: &str) -> Value {
    object["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn set_condition(object: &mut Value, condition: Value) {
    let conditions = object["status"]["conditions"]
        .as_array_mut()
        .expect("conditions");
    conditions.retain(|c| c["type"] != condition["type"]);
    conditions.push(condition);
}

/// A transient state, made from a captured one (the operator or runtime writes it only between
/// two reconciles, too briefly to capture): the name, what it is made from, how.
type Derived = (&'static str, &'static str, fn(&mut Value));

/// The transient states.
const DERIVED: &[Derived] = &[
    ("no status yet", "ready.yaml", |o| {
        o.as_object_mut().expect("object").remove("status");
    }),
    ("a new generation not yet observed", "ready.yaml", |o| {
        o["metadata"]["generation"] = json!(2);
    }),
    (
        "observed, but Ready still for the older generation",
        "ready.yaml",
        |o| {
            o["metadata"]["generation"] = json!(2);
            o["status"]["observedGeneration"] = json!(2);
        },
    ),
    (
        "the runtime reports a conflict the operator has not reconciled yet",
        "ready.yaml",
        |o| {
            let conflict = condition_of(
                &captured("degraded-host-object-conflict.yaml"),
                "RuntimeHealthy",
            );
            set_condition(o, conflict);
        },
    ),
    (
        "a new generation the runtime has not reported yet",
        "ready.yaml",
        |o| {
            o["metadata"]["generation"] = json!(2);
            o["status"]["observedGeneration"] = json!(2);
            let mut ready = condition_of(o, "Ready");
            ready["observedGeneration"] = json!(2);
            set_condition(o, ready);
        },
    ),
    (
        "the runtime restarts (Starting) before the operator reconciles",
        "ready.yaml",
        |o| {
            let mut starting = condition_of(o, "RuntimeHealthy");
            starting["status"] = json!("False");
            starting["reason"] = json!("Starting");
            starting["message"] = json!("listing example.loft.sh/v1 Car");
            set_condition(o, starting);
        },
    ),
];

/// (derived state, expected health, text the message must contain); the captured fixtures'
/// are [`vcp_tests::argocd::FIXTURE_HEALTH`]. The expected health is the README's table
/// ("Argo CD", "Status and condition reasons"), not the script's output.
const DERIVED_CASES: &[(&str, &str, &str)] = &[
    (
        "no status yet",
        "Progressing",
        "Waiting for vcluster-plugin-operator",
    ),
    (
        "a new generation not yet observed",
        "Progressing",
        "observe generation 2 (observed: 1)",
    ),
    (
        "observed, but Ready still for the older generation",
        "Progressing",
        "Ready condition is for generation 1, not yet for 2",
    ),
    (
        "the runtime reports a conflict the operator has not reconciled yet",
        "Degraded",
        "HostObjectConflict: 1 object(s) not synced",
    ),
    (
        "a new generation the runtime has not reported yet",
        "Progressing",
        "RuntimeUpdating: the runtime reports generation 1, not yet 2",
    ),
    (
        "the runtime restarts (Starting) before the operator reconciles",
        "Progressing",
        "Starting: listing example.loft.sh/v1 Car",
    ),
];

fn object_of(case: &str) -> Value {
    if case.ends_with(".yaml") {
        return captured(case);
    }
    let (_, from, derive) = DERIVED
        .iter()
        .find(|d| d.0 == case)
        .unwrap_or_else(|| panic!("no derived state {case:?}"));
    let mut object = captured(from);
    derive(&mut object);
    object
}

#[test]
fn health_lua_gives_each_outcome_in_both_engines() {
    let health = vcp_tests::argocd::health_lua();
    let cases: Vec<&(&str, &str, &str)> = vcp_tests::argocd::FIXTURE_HEALTH
        .iter()
        .chain(DERIVED_CASES)
        .collect();
    for (case, status, message) in cases.iter().copied() {
        let object = object_of(case);
        for (engine, (got_status, got_message)) in [
            ("Lua 5.1", run_lua51(&health, &object, case)),
            (
                "gopher-lua",
                vcp_tests::argocd::gopher_lua_health(&health, &object, case),
            ),
        ] {
            assert_eq!(
                &got_status, status,
                "{case} ({engine}): message {got_message:?}"
            );
            assert!(
                got_message.contains(message),
                "{case} ({engine}): message {got_message:?} lacks {message:?}"
            );
        }
        println!("{case}: {status} in Lua 5.1 and gopher-lua");
    }

    // Every captured fixture and every derived state is a case, and every outcome is covered.
    let mut files: Vec<String> = std::fs::read_dir(fixtures())
        .expect("read fixtures")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .chain(DERIVED.iter().map(|d| d.0.to_string()))
        .collect();
    files.sort();
    let mut cased: Vec<String> = cases.iter().map(|c| c.0.to_string()).collect();
    cased.sort();
    assert_eq!(files, cased, "every fixture needs an expected outcome");
    for outcome in ["Healthy", "Progressing", "Degraded"] {
        assert!(cases.iter().any(|c| c.1 == outcome), "no {outcome} case");
    }
}

#[test]
fn gopher_lua_opens_only_what_argo_cd_opens() {
    // Argo CD opens package, base, table and a safe os (time, date) for health scripts: the
    // string library, io and the rest of os are not there.
    let dir = tempfile_dir();
    for (script, allowed) in [
        (
            "return {status = tostring(#{1, 2}) == \"2\" and \"Healthy\" or \"Degraded\"}",
            true,
        ),
        (
            "local t = {} table.insert(t, 1) return {status = \"Healthy\"}",
            true,
        ),
        ("local n = os.time() return {status = \"Healthy\"}", true),
        (
            "local s = string.format(\"%d\", 1) return {status = \"Healthy\"}",
            false,
        ),
        ("io.write(\"x\") return {status = \"Healthy\"}", false),
        ("os.exit(1) return {status = \"Healthy\"}", false),
        (
            "local m = math.floor(1.5) return {status = \"Healthy\"}",
            false,
        ),
    ] {
        let path = dir.join("probe.lua");
        std::fs::write(&path, script).expect("write probe");
        let driver = vcp_tests::oracle_paths()
            .get("ARGOCD_LUA")
            .expect("ARGOCD_LUA");
        let mut child = Command::new(driver)
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run argocd-lua");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"{}")
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert_eq!(
            out.status.success(),
            allowed,
            "{script}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vcp-argocd-lua-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
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
