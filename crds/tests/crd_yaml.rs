//! The committed CRD YAML must equal what the Rust types generate, in every folder that holds a
//! copy (`crds/` and the kustomize base `config/crd/`), and `config/crd`'s kustomization must
//! list exactly those files.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

#[test]
fn committed_crds_match_the_types() {
    let root = repo_root();
    let bless = std::env::var_os("VCP_BLESS").is_some();
    for dir in vcp_crds::CRD_DIRS {
        for (file, crd) in vcp_crds::crd_files() {
            let want = vcp_crds::crd_yaml(&crd).expect("serialize CRD");
            let path = root.join(dir).join(file);
            if bless {
                std::fs::write(&path, &want).expect("write CRD");
                continue;
            }
            let have = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "read {}: {e}; run `VCP_BLESS=1 cargo test -p vcp-crds`",
                    path.display()
                )
            });
            assert!(
                have == want,
                "{} differs from the types; run `VCP_BLESS=1 cargo test -p vcp-crds` and commit the result",
                path.display()
            );
        }
    }
    assert_eq!(
        vcp_crds::crd_files()
            .iter()
            .map(|(f, _)| *f)
            .collect::<Vec<_>>(),
        vcp_crds::CRD_FILES
    );
}

#[test]
fn config_crd_kustomization_lists_every_crd() {
    let path = repo_root().join("config/crd/kustomization.yaml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse kustomization");
    let mut resources: Vec<&str> = doc["resources"]
        .as_sequence()
        .expect("resources: a list")
        .iter()
        .map(|r| r.as_str().expect("resource: a string"))
        .collect();
    resources.sort_unstable();
    let mut want = vcp_crds::CRD_FILES.to_vec();
    want.sort_unstable();
    assert_eq!(resources, want, "{}", path.display());
}
