//! The container image is built and run, not read: the Dockerfile's build stage is replayed on
//! this machine ([`vcp_tests::image`]: the context as `.dockerignore` leaves it, each `COPY`,
//! the `RUN` with its `ENV` in a chroot standing for the rust image, the cargo target folder
//! cached outside the repository), once per run of this binary, and what it produced is
//! checked against what the final stage promises:
//!
//! - the build stage compiles both binaries from exactly the files it copies, and they start;
//! - the final stage copies the workspace's `[[bin]]` targets (`cargo metadata`) to
//!   `/usr/local/bin`, runs as the numeric non-root user 65532, and its entrypoint, the operator,
//!   starts as that user in the final stage's root filesystem;
//! - the binaries need no shared library beyond what `distroless/cc-debian12` has, and the
//!   embedded runtime, which vCluster's own container also runs as a v2 plugin, is static: it
//!   starts alone in an empty root filesystem and talks TLS to a real API server from there;
//! - the base images are pinned, and `config/manager` runs this image at the workspace's version;
//! - the release build is the root's build from source and carries no test machinery: cargo
//!   resolves it without the test features, and no `VCP_FAULT_` or `/state` figure is in the
//!   binaries' bytes (as `strings` would show it), while the test build of the same binaries has
//!   them (they sit behind features only the test crate enables).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vcp_tests::image::{
    DISTROLESS_CC_LIBRARIES, Image, dynamic_needs, provide_libraries, run_in_root,
};
use vcp_tests::{Cluster, ControlPlane, Identity, install_crds, repo_root};

/// The replayed build, made by the first test that asks (one build per run of this binary).
fn image() -> &'static Image {
    static IMAGE: OnceLock<Result<Image, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let started = std::time::Instant::now();
            let image = Image::build(&repo_root()).map_err(|e| format!("{e:#}"));
            if let Ok(image) = &image {
                eprintln!(
                    "image: Dockerfile replayed in {:.1} s ({:.1} s in RUN), in {}",
                    started.elapsed().as_secs_f64(),
                    image.run_time.as_secs_f64(),
                    image.dir.display()
                );
            }
            image
        })
        .as_ref()
        .unwrap_or_else(|e| panic!("docker build (replayed) fails: {e}"))
}

/// A workspace package, from `cargo metadata --no-deps`.
struct Package {
    name: String,
    version: String,
    rust_version: Option<String>,
    /// Its `[[bin]]` targets.
    bins: Vec<String>,
}

fn package(name: &str) -> Package {
    workspace()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("package {name}"))
}

fn workspace() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(repo_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let bins = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .filter(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "bin"))
                })
                .map(|t| t["name"].as_str().expect("target name").to_string())
                .collect();
            Package {
                name: p["name"].as_str().expect("name").to_string(),
                version: p["version"].as_str().expect("version").to_string(),
                rust_version: p["rust_version"].as_str().map(str::to_string),
                bins,
            }
        })
        .collect()
}

/// The final stage's binaries: file name → path in the image (from its `COPY --from` lines).
fn image_binaries(image: &Image) -> BTreeMap<String, String> {
    image
        .final_copies()
        .into_iter()
        .map(|(_, source, dest)| {
            let name = Path::new(&source)
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            let path = if dest.ends_with('/') {
                format!("{dest}{name}")
            } else {
                dest
            };
            (name, path)
        })
        .collect()
}

/// `USER uid:gid` of the final stage, numeric.
fn final_user(image: &Image) -> (u32, u32) {
    let user = image.final_user().expect("the final stage sets USER");
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let numeric = |s: &str| -> u32 {
        s.parse().unwrap_or_else(|_| {
            panic!("USER {user} is not numeric (runAsNonRoot cannot verify a name)")
        })
    };
    (numeric(uid), numeric(gid))
}

/// Host path of `path` in the final stage's root filesystem.
fn in_final_root(image: &Image, path: &str) -> PathBuf {
    image.final_root().join(path.trim_start_matches('/'))
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_build_stage_compiles_both_binaries_from_the_files_it_copies_and_they_start() {
    let image = image();
    // Each binary the final stage takes from the build stage exists there...
    let copies = image.final_copies();
    assert_eq!(copies.len(), 2, "{copies:?}");
    for (stage, source, _) in &copies {
        let built = image.roots[*stage].join(source.trim_start_matches('/'));
        assert!(built.is_file(), "the build stage did not produce {source}");
        // ... and starts: `--help` exits 0 with clap's usage line.
        let out = Command::new(&built).arg("--help").output().expect("run");
        assert!(out.status.success(), "{source} --help: {out:?}");
        let name = Path::new(source).file_name().unwrap().to_string_lossy();
        assert!(
            stdout(&out).contains(&format!("Usage: {name}")),
            "{source} --help: {}",
            stdout(&out)
        );
    }
}

#[test]
fn the_final_stage_holds_the_workspace_binaries_and_starts_the_operator_as_non_root() {
    let image = image();
    // Exactly the workspace's [[bin]] targets, each at /usr/local/bin/<name>.
    let expected: BTreeMap<String, String> = workspace()
        .into_iter()
        .flat_map(|p| p.bins)
        .map(|b| (b.clone(), format!("/usr/local/bin/{b}")))
        .collect();
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        ["vcluster-plugin-operator", "vcluster-plugin-syncer"]
    );
    let binaries = image_binaries(image);
    assert_eq!(binaries, expected);
    for path in binaries.values() {
        let meta = std::fs::metadata(in_final_root(image, path))
            .unwrap_or_else(|e| panic!("{path} is not in the image: {e}"));
        assert!(
            meta.is_file()
                && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o001 != 0,
            "{path} must be a file everyone may execute (the image runs as non-root)"
        );
    }

    // distroless's `nonroot` user, by number.
    assert_eq!(image.final_user(), Some("65532:65532"));
    let (uid, gid) = final_user(image);
    assert_ne!(uid, 0, "the image must not run as root");

    // The entrypoint is the operator, and it starts there as that user.
    let entrypoint = image.entrypoint().expect("ENTRYPOINT");
    assert_eq!(entrypoint, ["/usr/local/bin/vcluster-plugin-operator"]);
    let root = image.dir.join("final-with-glibc");
    copy_dir(image.final_root(), &root);
    for path in binaries.values() {
        provide_libraries(&in_final_root(image, path), &root).expect("provide glibc");
    }
    let mut argv: Vec<&str> = entrypoint.iter().map(String::as_str).collect();
    argv.push("--help");
    let out = run_in_root(&root, uid, gid, &argv).expect("run the entrypoint");
    assert!(out.status.success(), "{argv:?} as {uid}:{gid}: {out:?}");
    assert!(
        stdout(&out).contains("Usage: vcluster-plugin-operator"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn the_binaries_need_no_shared_library_beyond_the_distroless_cc_base() {
    let image = image();
    for (name, path) in image_binaries(image) {
        let (needed, interpreter) =
            dynamic_needs(&in_final_root(image, &path)).expect("read the ELF file");
        let extra: Vec<&String> = needed
            .iter()
            .filter(|lib| !DISTROLESS_CC_LIBRARIES.contains(&lib.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{name} needs {extra:?}, which gcr.io/distroless/cc-debian12 does not have"
        );
        if let Some(interpreter) = &interpreter {
            let file = Path::new(interpreter)
                .file_name()
                .unwrap()
                .to_string_lossy();
            assert!(
                DISTROLESS_CC_LIBRARIES.contains(&file.as_ref()),
                "{name}'s interpreter {interpreter}"
            );
        }
        // The runtime also runs inside vCluster's own container (v2 plugin): static.
        if name == "vcluster-plugin-syncer" {
            assert_eq!(
                (needed.as_slice(), interpreter.as_deref()),
                (&[][..], None),
                "{name} must be statically linked"
            );
        }
    }
}

/// The text every variable of the test-only fault point (`vcp_crds::fault`) begins with.
const FAULT_ENV_PREFIX: &[u8] = b"VCP_FAULT_";
/// A figure of the operator's test endpoint `/state` (`Telemetry::state`, feature
/// `reconcile-log` only): its name is in the binary exactly when the endpoint is.
const STATE_MARKER: &[u8] = b"reconciled_gone";
/// The cargo features that carry test machinery (the fault point, `/state`, the counting
/// allocator), which only the test crate turns on.
const TEST_FEATURES: [&str; 3] = ["test-faults", "reconcile-log", "heap-count"];

/// Whether `needle` occurs anywhere in the file at `path` (a byte search, as `strings | grep`).
fn file_contains(path: &Path, needle: &[u8]) -> bool {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// Cargo's own resolution of a build at the workspace root (`cargo tree`, which selects
/// packages and unifies features as `cargo build` does, without compiling), with `extra`
/// arguments: the workspace's packages it builds → their features.
fn resolved_workspace_features(extra: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["tree", "--locked", "-e", "normal,build", "--prefix", "none"])
        .args(["-f", "{p}|{f}"])
        .args(extra)
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree: {out:?}");
    let root = repo_root().display().to_string();
    let mut resolved: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in stdout(&out).lines() {
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // "name version (path)": the workspace's own packages, not the vendored QuickJS.
        if !package.contains(&format!("({root}/")) || package.contains("/vendor/") {
            continue;
        }
        let name = package.split(' ').next().unwrap_or_default().to_string();
        let features = features.trim_end_matches(" (*)");
        resolved.entry(name).or_default().extend(
            features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(String::from),
        );
    }
    resolved
}

/// The ordinary release build carries no test machinery, shown three ways:
/// - the Dockerfile's `cargo build` names no package, so it builds what the README's build from
///   source (`cargo build --release --locked` at the root) builds: the root's `default-members`;
/// - cargo resolves that build to the product's three crates without a test feature, while
///   `--workspace` (the test crate's build) turns them on, so the reading can see them;
/// - the image's binaries hold neither the fault point's variables nor `/state`'s figure, which
///   the test build of the same binaries holds.
///
/// Before `default-members`, the root build included the test crate and cargo's feature
/// unification turned `test-faults` and `reconcile-log` on in the release binaries.
#[test]
fn the_release_build_carries_no_test_machinery() {
    let image = image();
    let commands: Vec<&str> = image
        .dockerfile
        .stages
        .iter()
        .flat_map(|stage| &stage.steps)
        .filter_map(|step| match step {
            vcp_tests::image::Step::Run { command, .. } => Some(command.as_str()),
            _ => None,
        })
        .collect();
    // The `cargo build` command itself: from its name to the next `&&`.
    let build = commands
        .iter()
        .find_map(|c| c.find("cargo build").map(|at| &c[at..]))
        .unwrap_or_else(|| panic!("no RUN with cargo build: {commands:?}"));
    let build = build.split("&&").next().unwrap_or_default();
    assert!(build.contains("cargo build --release --locked"), "{build}");
    for selects in [" -p ", " --package", " --workspace", " --all"] {
        assert!(
            !build.contains(selects),
            "the Dockerfile's build selects packages ({selects}): {build}"
        );
    }

    let root = resolved_workspace_features(&[]);
    assert_eq!(
        root.keys().map(String::as_str).collect::<Vec<_>>(),
        ["vcluster-plugin-operator", "vcp-crds", "vcp-syncer-runtime"],
        "what a build at the root builds: {root:?}"
    );
    for (package, features) in &root {
        for feature in TEST_FEATURES {
            assert!(
                !features.contains(feature),
                "{package} resolved with {feature} at the root: {features:?}"
            );
        }
    }
    let workspace = resolved_workspace_features(&["--workspace"]);
    assert!(
        workspace["vcluster-plugin-operator"].contains("test-faults")
            && workspace["vcluster-plugin-operator"].contains("reconcile-log"),
        "the test crate's build lacks the test features: the reading cannot be trusted: {workspace:?}"
    );

    // The search finds the texts where the machinery is compiled in: the test build of the same
    // binaries (tests/src/process.rs builds them with the test features).
    for (package, bin, needles) in [
        (
            "vcluster-plugin-operator",
            "vcluster-plugin-operator",
            &[FAULT_ENV_PREFIX, STATE_MARKER][..],
        ),
        (
            "vcp-syncer-runtime",
            "vcluster-plugin-syncer",
            &[FAULT_ENV_PREFIX][..],
        ),
    ] {
        let test_build = vcp_tests::workspace_binary(package, bin);
        for needle in needles {
            assert!(
                file_contains(&test_build, needle),
                "{} (test build) lacks {}: the search cannot be trusted",
                test_build.display(),
                String::from_utf8_lossy(needle)
            );
        }
    }
    // The image's binaries (the Dockerfile's release build) have neither.
    let binaries = image_binaries(image);
    assert_eq!(binaries.len(), 2, "{binaries:?}");
    for (name, path) in binaries {
        let file = in_final_root(image, &path);
        for needle in [FAULT_ENV_PREFIX, STATE_MARKER] {
            assert!(
                !file_contains(&file, needle),
                "{name} in the image contains {}: test machinery in a release binary",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

/// A root filesystem holding only the runtime's binary (plus `extra` files at their paths).
fn runtime_alone(image: &Image, name: &str, extra: &[&Path]) -> PathBuf {
    let root = image.dir.join(name);
    if root.exists() {
        std::fs::remove_dir_all(&root).unwrap();
    }
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(
        in_final_root(image, "/usr/local/bin/vcluster-plugin-syncer"),
        root.join("vcluster-plugin-syncer"),
    )
    .unwrap();
    for file in extra {
        let target = root.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(file, target).unwrap();
    }
    root
}

#[test]
fn the_runtime_starts_alone_in_an_empty_root_filesystem() {
    let image = image();
    let root = runtime_alone(image, "runtime-alone", &[]);
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        1,
        "only the binary"
    );
    let (uid, gid) = final_user(image);
    let help = run_in_root(&root, uid, gid, &["/vcluster-plugin-syncer", "--help"]).unwrap();
    assert!(help.status.success(), "--help: {help:?}");
    assert!(
        stdout(&help).contains("Usage: vcluster-plugin-syncer"),
        "{}",
        stdout(&help)
    );
    let version = run_in_root(&root, uid, gid, &["/vcluster-plugin-syncer", "--version"]).unwrap();
    assert!(version.status.success(), "--version: {version:?}");
    assert_eq!(
        stdout(&version),
        format!(
            "vcluster-plugin-syncer {}\n",
            package("vcp-syncer-runtime").version
        )
    );
}

#[test]
fn the_runtime_alone_in_an_empty_root_talks_tls_to_an_api_server() {
    let image = image();
    let plane = ControlPlane::shared();
    // The CRD installed, so that an absent VClusterPlugin is the API's NotFound status.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        install_crds(&plane.client(Cluster::Host, Identity::Admin).await).await
    });
    // The binary, the kubeconfigs and the CA certificate they name: nothing else (no /etc, no
    // /proc, no CA bundle; the server is 127.0.0.1, so no name lookup).
    let host = plane.kubeconfig(Cluster::Host, Identity::Admin);
    let virtual_ = plane.kubeconfig(Cluster::Virtual, Identity::Admin);
    let ca = plane.dir().join("pki/ca.crt");
    let root = runtime_alone(image, "runtime-alone-tls", &[&host, &virtual_, &ca]);
    let (uid, gid) = final_user(image);
    let out = run_in_root(
        &root,
        uid,
        gid,
        &[
            "/vcluster-plugin-syncer",
            "--host-kubeconfig",
            host.to_str().unwrap(),
            "--virtual-kubeconfig",
            virtual_.to_str().unwrap(),
            "--namespace",
            "default",
            "--plugin",
            "no-such-plugin",
        ],
    )
    .unwrap();
    // rustls (ring) made the TLS connection and the API server answered NotFound: the
    // runtime's PluginNotFound, which it reports only for that answer (a TLS or connection
    // failure is another error).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("VClusterPlugin default/no-such-plugin not found on the host"),
        "{stderr}"
    );
}

#[test]
fn base_images_are_pinned_and_config_manager_runs_this_image() {
    let image = image();
    let stages = &image.dockerfile.stages;
    assert_eq!(stages.len(), 2, "{stages:?}");
    for stage in stages {
        let last = stage.image.rsplit('/').next().expect("image name");
        let pinned_tag = last
            .split_once(':')
            .is_some_and(|(_, tag)| !tag.is_empty() && tag != "latest");
        assert!(
            stage.image.contains("@sha256:") || pinned_tag,
            "base image {} is not pinned to a tag or digest",
            stage.image
        );
    }
    // The toolchain is at least every package's rust-version.
    let numbers = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    let tag = stages[0].image.rsplit_once(':').expect("a tag").1;
    let rust = numbers(tag.split('-').next().unwrap());
    for p in workspace() {
        if let Some(min) = &p.rust_version {
            assert!(
                rust >= numbers(min),
                "{} is older than {}'s rust-version {min}",
                stages[0].image,
                p.name
            );
        }
    }

    // The Deployment runs this image, at the workspace's version, as the image's user.
    let (uid, _) = final_user(image);
    let text = std::fs::read_to_string(repo_root().join("config/manager/manager.yaml"))
        .expect("read config/manager/manager.yaml");
    let deployment: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse manager.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let version = package("vcluster-plugin-operator").version;
    assert_eq!(
        container["image"].as_str(),
        Some(format!("ghcr.io/vcp-dev/vcluster-plugin-operator:{version}").as_str())
    );
    assert_eq!(
        container["command"][0].as_str(),
        image
            .entrypoint()
            .and_then(|e| e.first())
            .map(String::as_str)
    );
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_u64(),
        Some(u64::from(uid))
    );
}

fn copy_dir(from: &Path, to: &Path) {
    if to.exists() {
        std::fs::remove_dir_all(to).unwrap();
    }
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
