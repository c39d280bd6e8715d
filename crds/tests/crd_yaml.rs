//! The committed CRD YAML must equal what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bless = std::env::var_os("VCP_BLESS").is_some();
    for (file, crd) in vcp_crds::crd_files() {
        let want = vcp_crds::crd_yaml(&crd).expect("serialize CRD");
        let path = dir.join(file);
        if bless {
            std::fs::write(&path, &want).expect("write CRD");
            continue;
        }
        let have = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}; run `VCP_BLESS=1 cargo test -p vcp-crds`", path.display()));
        assert!(
            have == want,
            "{} differs from the types; run `VCP_BLESS=1 cargo test -p vcp-crds` and commit the result",
            path.display()
        );
    }
    assert_eq!(
        vcp_crds::crd_files().iter().map(|(f, _)| *f).collect::<Vec<_>>(),
        vcp_crds::CRD_FILES
    );
}
