//! The ordinary build from source, `cargo build --release --locked` at the workspace root (the
//! README's command), builds the product's three crates only and carries no test machinery.
//!
//! Before, the root build built every member, the test crate too, and cargo's feature
//! unification then turned on the test crate's `test-faults` and `reconcile-log` for the
//! operator and the runtime: `strings` found `VCP_FAULT_ABORT_AFTER_WRITES` in
//! `target/release/vcluster-plugin-operator`, and it served `/state`. The root `Cargo.toml`'s
//! `default-members` now leaves the test crate out of a build that names no package; `cargo
//! test --workspace` still builds it with its features.
//!
//! Checked three ways on one release build (its cost: a build of the release profile, cold on
//! a machine's first run, incremental after it: [`target_dir`]):
//! - cargo's own report of the build (`--message-format=json`): which workspace packages it
//!   built, and with which features;
//! - the bytes of both binaries: no `VCP_FAULT_` (the fault point's variables) and no
//!   `reconciled_gone` (a figure only `/state` serves);
//! - the search is shown to find both in the test build of the same binaries
//!   (`vcp_tests::workspace_binary`, built with the test features).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vcp_tests::repo_root;

/// The text every variable of the test-only fault point (`vcp_crds::fault`) begins with.
const FAULT_ENV_PREFIX: &[u8] = b"VCP_FAULT_";
/// A figure of the operator's test endpoint `/state` (`Telemetry::state`, feature
/// `reconcile-log` only): its name is in the binary exactly when the endpoint is.
const STATE_MARKER: &[u8] = b"reconciled_gone";

/// Whether `needle` occurs anywhere in the file at `path` (a byte search, as `strings | grep`).
fn file_contains(path: &Path, needle: &[u8]) -> bool {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// The target folder of the build: kept between runs under the tests' cache
/// (`$VCP_CACHE_DIR/root-release/<checkout>/`, as the image's build in `vcp_tests::image`), so
/// only the first run of a machine compiles the release profile from scratch (minutes on 2
/// cores) and the later ones rebuild what changed. The folder is where the output goes, not
/// what is built: the command and its features are the README's.
fn target_dir() -> PathBuf {
    let cache = vcp_tests::image::cache_dir().expect("the tests' cache folder");
    let key = vcp_tests::image::checkout_key(&repo_root()).expect("the checkout's key");
    cache.join("root-release").join(key)
}

#[test]
fn a_release_build_at_the_workspace_root_carries_no_test_machinery() {
    // The search finds what it looks for where the test machinery is compiled in.
    let test_operator =
        vcp_tests::workspace_binary("vcluster-plugin-operator", "vcluster-plugin-operator");
    let test_syncer = vcp_tests::workspace_binary("vcp-syncer-runtime", "vcluster-plugin-syncer");
    for (path, needles) in [
        (&test_operator, &[FAULT_ENV_PREFIX, STATE_MARKER][..]),
        (&test_syncer, &[FAULT_ENV_PREFIX][..]),
    ] {
        for needle in needles {
            assert!(
                file_contains(path, needle),
                "{} (test build) lacks {}: the search cannot be trusted",
                path.display(),
                String::from_utf8_lossy(needle)
            );
        }
    }

    // The ordinary build, as the README gives it.
    let target = target_dir();
    let started = std::time::Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["build", "--release", "--locked", "--message-format=json"])
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --release --locked failed:\n{}",
        vcp_tests::process::tail_of_output(&out.stderr)
    );
    println!(
        "cargo build --release --locked at the root: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // What cargo built of the workspace, and with which features.
    let root = repo_root();
    let mut built: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut executables = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let manifest = message["manifest_path"].as_str().unwrap_or_default();
        if !Path::new(manifest).starts_with(&root) || manifest.contains("/vendor/") {
            continue;
        }
        let name = message["target"]["name"].as_str().unwrap_or_default();
        let package = Path::new(manifest)
            .parent()
            .and_then(Path::file_name)
            .map(|d| d.to_string_lossy().to_string())
            .unwrap_or_default();
        let features = built.entry(package).or_default();
        for feature in message["features"].as_array().into_iter().flatten() {
            features.insert(feature.as_str().unwrap_or_default().to_string());
        }
        if let Some(executable) = message["executable"].as_str() {
            executables.insert(name.to_string(), PathBuf::from(executable));
        }
    }
    println!("built: {built:?}");
    assert_eq!(
        built.keys().map(String::as_str).collect::<Vec<_>>(),
        ["crds", "operator", "syncer-runtime"],
        "the workspace folders the root build built"
    );
    for (package, features) in &built {
        for test_feature in ["test-faults", "reconcile-log"] {
            assert!(
                !features.contains(test_feature),
                "{package} built with {test_feature}: {features:?}"
            );
        }
    }

    // The binaries it wrote carry neither the fault point nor `/state`.
    for bin in ["vcluster-plugin-operator", "vcluster-plugin-syncer"] {
        let path = executables
            .get(bin)
            .unwrap_or_else(|| panic!("the root build made no {bin}: {executables:?}"));
        assert_eq!(path, &target.join("release").join(bin));
        for needle in [FAULT_ENV_PREFIX, STATE_MARKER] {
            assert!(
                !file_contains(path, needle),
                "{} contains {}: test machinery in the ordinary release build",
                path.display(),
                String::from_utf8_lossy(needle)
            );
        }
    }
}
