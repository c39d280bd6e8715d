//! The committed CRD YAML must equal what the Rust types generate, in `crds/` and in each other
//! copy (the kustomize base `config/crd/` for VClusterPlugin, `config/samples/crd/` for the
//! tutorial's Car), and `config/crd`'s kustomization must list exactly the copies it holds.

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
    let everywhere = vcp_crds::CRD_FILES
        .iter()
        .map(|file| (vcp_crds::CRD_DIR, *file))
        .chain(vcp_crds::CRD_COPIES);
    for (dir, file) in everywhere {
        let crd = vcp_crds::crd_files()
            .into_iter()
            .find(|(f, _)| *f == file)
            .map(|(_, crd)| crd)
            .unwrap_or_else(|| panic!("{dir}/{file} is not one of CRD_FILES"));
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
    assert_eq!(
        vcp_crds::crd_files()
            .iter()
            .map(|(f, _)| *f)
            .collect::<Vec<_>>(),
        vcp_crds::CRD_FILES
    );
}

#[test]
fn config_crd_kustomization_lists_the_crds_it_holds() {
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
    let mut want: Vec<&str> = vcp_crds::CRD_COPIES
        .iter()
        .filter(|(dir, _)| *dir == "config/crd")
        .map(|(_, file)| *file)
        .collect();
    want.sort_unstable();
    assert_eq!(resources, want, "{}", path.display());
}
