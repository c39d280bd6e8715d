//! The operator binary's subcommands as a user runs them: `crd` prints the committed CRDs,
//! `import` writes manifests on stdout and warnings / errors on stderr with the right exit code.
//! Cargo builds the binary for this test (`CARGO_BIN_EXE_vcluster-plugin-operator`).

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

fn operator(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vcluster-plugin-operator"))
        .args(args)
        .current_dir(repo_root())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run vcluster-plugin-operator")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

#[test]
fn crd_prints_both_committed_crds() {
    let out = operator(&["crd"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let want: Vec<String> = vcp_crds::CRD_FILES
        .iter()
        .map(|f| std::fs::read_to_string(repo_root().join("crds").join(f)).expect("read CRD"))
        .collect();
    assert_eq!(text(&out.stdout), want.join("---\n"));
    let names: Vec<String> = serde_yaml::Deserializer::from_str(&text(&out.stdout))
        .map(|d| {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("document");
            v["metadata"]["name"].as_str().expect("name").to_string()
        })
        .collect();
    assert_eq!(names, ["vclusterplugins.vcp.dev", "cars.example.loft.sh"]);
}

#[test]
fn import_of_the_tutorial_plugin_yaml() {
    let out = operator(&[
        "import",
        "-f",
        "tests/fixtures/import/plugin.yaml",
        "--vcluster",
        "my-vcluster",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fixture = std::fs::read_to_string(repo_root().join("tests/fixtures/import/plugin.yaml"))
        .expect("fixture");
    // Namespace defaults to the vCluster's name.
    let lib = vcluster_plugin_operator::import::import(&fixture, "my-vcluster", "my-vcluster")
        .expect("import");
    assert_eq!(text(&out.stdout), lib.yaml);
    assert!(text(&out.stdout).contains("namespace: my-vcluster"));
    // The vCluster's own `rbac:` is named on stderr, not silently dropped.
    assert_eq!(
        text(&out.stderr),
        "warning: tests/fixtures/import/plugin.yaml: rbac: the vCluster's own RBAC settings are not a plugin setting; ignored (the operator grants each plugin's rules itself)\n"
    );
}

#[test]
fn import_names_unknown_keys_on_stderr() {
    let dir = std::env::temp_dir().join(format!("vcp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("unknown.yaml");
    std::fs::write(&file, "plugin:\n  crd-sync:\n    image: a:1\n    foo: 1\n").expect("write");
    let out = operator(&[
        "import",
        "-f",
        file.to_str().expect("path"),
        "--vcluster",
        "v",
        "-n",
        "team-a",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("plugin.crd-sync.foo: unknown plugin key"),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("name: crd-sync"));
    assert!(text(&out.stdout).contains("namespace: team-a"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn import_of_malformed_yaml_fails_with_line_and_column_and_prints_nothing() {
    let dir = std::env::temp_dir().join(format!("vcp-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("bad.yaml");
    std::fs::write(&file, "plugins:\n  crd-sync:\n    image: [unclosed\n").expect("write");
    let out = operator(&[
        "import",
        "-f",
        file.to_str().expect("path"),
        "--vcluster",
        "v",
    ]);
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: {}: malformed YAML at line ",
            file.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains(", column "), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);

    let missing = operator(&["import", "-f", "no/such/file.yaml", "--vcluster", "v"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(missing.stdout.is_empty());
    assert!(text(&missing.stderr).contains("cannot read no/such/file.yaml"));
}

#[test]
fn run_flags_still_parse_without_a_subcommand() {
    // `--help` of the default command lists the run flags; `import --help` its own.
    let out = operator(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--runtime-image",
        "--concurrency",
        "--log",
        "crd",
        "import",
        "run",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    let out = operator(&["import", "--help"]);
    assert!(text(&out.stdout).contains("--vcluster"));
    let bad = operator(&["--no-such-flag"]);
    assert_eq!(bad.status.code(), Some(2), "clap usage error");
}
