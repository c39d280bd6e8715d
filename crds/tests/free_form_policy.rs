//! The committed nesting-bound policy (`config/admission/free-form-depth.yaml`) must equal what
//! `vcp_crds::free_form::policy_yaml` generates, and `config/admission`'s kustomization must
//! install it.

use std::path::{Path, PathBuf};

use vcp_crds::free_form::{POLICY_FILE, policy_yaml};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

#[test]
fn committed_policy_matches_the_generator() {
    let path = repo_root().join(POLICY_FILE);
    let want = policy_yaml();
    if std::env::var_os("VCP_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write the policy");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e}; run `VCP_BLESS=1 cargo test -p vcp-crds`",
            path.display()
        )
    });
    assert!(
        have == want,
        "{} differs from crds/src/free_form.rs; run `VCP_BLESS=1 cargo test -p vcp-crds` and commit the result",
        path.display()
    );
    // Two documents, both named as the module says, the policy with one validation per field.
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&have)
        .map(|d| serde::Deserialize::deserialize(d).expect("policy YAML"))
        .collect();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0]["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(docs[1]["kind"], "ValidatingAdmissionPolicyBinding");
    assert_eq!(
        docs[0]["spec"]["validations"].as_sequence().map(Vec::len),
        Some(vcp_crds::free_form::FREE_FORM_FIELDS.len())
    );
}

#[test]
fn config_admission_installs_the_policy() {
    let path = repo_root().join("config/admission/kustomization.yaml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse kustomization");
    let file = Path::new(POLICY_FILE)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        doc["resources"]
            .as_sequence()
            .expect("resources: a list")
            .iter()
            .any(|r| r.as_str() == Some(file)),
        "{} does not list {file}",
        path.display()
    );
}
