//! The `<prefix>_build_info` metric of both binaries: a constant `1` whose labels say which
//! build answers (Prometheus' convention for build information, as `go_build_info` and
//! `prometheus_build_info` do), so that a dashboard can join any other series on the version.

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The version every crate of the workspace carries (`Cargo.toml`'s `workspace.package`), which
/// is also the image's tag.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Registers `<prefix>_build_info{version="<VERSION>"} 1` in `registry`, where `prefix` is the
/// binary's metric prefix (`vcp_operator`, `vcp_runtime`).
pub fn register(registry: &mut Registry, prefix: &str) {
    registry.register(
        format!("{prefix}_build"),
        "The build of this process: 1, with its version as a label",
        Info::new(vec![("version".to_string(), VERSION.to_string())]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_line_with_the_workspace_version() {
        let mut registry = Registry::default();
        register(&mut registry, "vcp_test");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // the workspace's version, read from its manifest rather than from the constant
        let manifest = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"),
        )
        .unwrap();
        let version = manifest
            .lines()
            .find_map(|l| l.strip_prefix("version = \""))
            .and_then(|v| v.strip_suffix('"'))
            .expect("the workspace's version");
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [format!("vcp_test_build_info{{version=\"{version}\"}} 1")]
        );
        assert!(text.contains("# TYPE vcp_test_build info"), "{text}");
    }
}
