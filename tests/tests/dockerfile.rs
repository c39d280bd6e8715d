//! The Dockerfile builds what the workspace defines. No container engine runs here, so these
//! are checks of the files: the binaries the image holds are exactly the workspace's `[[bin]]`
//! targets (from `cargo metadata`), built with `--locked` from pinned base images, run as
//! non-root; the operator Deployment in config/manager runs that image at the workspace's version.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use vcp_tests::repo_root;

/// One Dockerfile instruction: keyword (upper case) and its arguments, continuations joined.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// The Dockerfile's stages: each starts at a `FROM`.
fn stages() -> Vec<Vec<Instruction>> {
    let text = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("read Dockerfile");
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (keyword, args) = current
                    .split_once(char::is_whitespace)
                    .unwrap_or((&current, ""));
                instructions.push(Instruction {
                    keyword: keyword.to_uppercase(),
                    args: args.trim().to_string(),
                });
                current.clear();
            }
        }
    }
    assert!(current.is_empty(), "the Dockerfile ends in a continuation");
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for i in instructions {
        if i.keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .push(i);
    }
    stages
}

/// `FROM image [AS name]` of a stage: (image, name).
fn from(stage: &[Instruction]) -> (String, Option<String>) {
    let words: Vec<&str> = stage[0].args.split_whitespace().collect();
    let name = match words.as_slice() {
        [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
        [_] => None,
        other => panic!("unexpected FROM {other:?}"),
    };
    (words[0].to_string(), name)
}

/// A workspace package, from `cargo metadata --no-deps`.
#[derive(Debug)]
struct Package {
    name: String,
    /// Folder of its Cargo.toml, relative to the repository root.
    dir: PathBuf,
    bins: Vec<String>,
    rust_version: Option<String>,
    version: String,
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
    let root = repo_root().canonicalize().expect("repo root");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest_path"));
            Package {
                name: p["name"].as_str().expect("name").to_string(),
                dir: manifest
                    .parent()
                    .expect("manifest folder")
                    .strip_prefix(&root)
                    .expect("a member inside the repository")
                    .to_path_buf(),
                bins: p["targets"]
                    .as_array()
                    .expect("targets")
                    .iter()
                    .filter(|t| {
                        t["kind"]
                            .as_array()
                            .is_some_and(|k| k.iter().any(|k| k == "bin"))
                    })
                    .map(|t| t["name"].as_str().expect("target name").to_string())
                    .collect(),
                rust_version: p["rust_version"].as_str().map(str::to_string),
                version: p["version"].as_str().expect("version").to_string(),
            }
        })
        .collect()
}

/// Binary name → package, for every `[[bin]]` of the workspace.
fn workspace_bins(packages: &[Package]) -> BTreeMap<String, String> {
    packages
        .iter()
        .flat_map(|p| p.bins.iter().map(|b| (b.clone(), p.name.clone())))
        .collect()
}

/// `COPY` arguments without flags: (flags, sources, destination).
fn copy_args(i: &Instruction) -> (Vec<String>, Vec<String>, String) {
    let words: Vec<String> = i.args.split_whitespace().map(str::to_string).collect();
    let (flags, paths): (Vec<String>, Vec<String>) =
        words.into_iter().partition(|w| w.starts_with("--"));
    let (dest, sources) = paths.split_last().expect("COPY with a destination");
    (flags, sources.to_vec(), dest.clone())
}

fn version_tuple(v: &str) -> Vec<u32> {
    v.split('.')
        .map(|n| n.parse().expect("a numeric version"))
        .collect()
}

#[test]
fn the_image_holds_exactly_the_workspace_binaries_built_locked() {
    let packages = workspace();
    let bins = workspace_bins(&packages);
    assert!(
        bins.contains_key("vcluster-plugin-operator")
            && bins.contains_key("vcluster-plugin-syncer"),
        "{bins:?}"
    );
    let stages = stages();
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    let builder = &stages[0];
    let runtime = stages.last().expect("a final stage");
    let builder_name = from(builder)
        .1
        .expect("the build stage is named (FROM ... AS name)");

    // The build: release, --locked, exactly the packages that own the binaries.
    let builds: Vec<&Instruction> = builder
        .iter()
        .filter(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .collect();
    assert_eq!(builds.len(), 1, "one cargo build: {builds:?}");
    let command = builds[0]
        .args
        .split("&&")
        .find(|c| c.contains("cargo build"))
        .expect("the cargo build command");
    let words: Vec<&str> = command.split_whitespace().collect();
    assert!(words.contains(&"--release"), "{command}");
    assert!(words.contains(&"--locked"), "{command}");
    let built: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "-p" || w[0] == "--package")
        .map(|w| w[1])
        .collect();
    let owners: BTreeSet<&str> = bins.values().map(String::as_str).collect();
    assert_eq!(
        built, owners,
        "the packages built are the ones with binaries"
    );
    // ... and the release binaries are the ones taken out of the (cached) target folder.
    let taken: BTreeSet<&str> = builds[0]
        .args
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("target/release/"))
        .collect();
    let names: BTreeSet<&str> = bins.keys().map(String::as_str).collect();
    assert_eq!(taken, names, "{}", builds[0].args);

    // The image: each binary copied from the build stage to /usr/local/bin, nothing else.
    let mut copied = BTreeMap::new();
    for i in runtime.iter().filter(|i| i.keyword == "COPY") {
        let (flags, sources, dest) = copy_args(i);
        assert!(
            flags.contains(&format!("--from={builder_name}")),
            "the final stage copies only build outputs: {i:?}"
        );
        assert_eq!(sources.len(), 1, "{i:?}");
        let name = Path::new(&sources[0])
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        assert_eq!(dest, format!("/usr/local/bin/{name}"), "{i:?}");
        copied.insert(name, dest);
    }
    assert_eq!(
        copied.keys().collect::<Vec<_>>(),
        bins.keys().collect::<Vec<_>>(),
        "the image's binaries are the workspace's [[bin]] targets"
    );

    // The entrypoint is the operator.
    let entrypoint = runtime
        .iter()
        .rfind(|i| i.keyword == "ENTRYPOINT")
        .expect("ENTRYPOINT");
    let entrypoint: Vec<String> =
        serde_json::from_str(&entrypoint.args).expect("ENTRYPOINT in exec (JSON) form");
    assert_eq!(
        entrypoint.first(),
        copied.get("vcluster-plugin-operator"),
        "{entrypoint:?}"
    );

    // Every workspace member's manifest reaches the build stage: cargo reads them all.
    let sources: Vec<String> = builder
        .iter()
        .filter(|i| i.keyword == "COPY")
        .flat_map(|i| copy_args(i).1)
        .collect();
    for file in ["Cargo.toml", "Cargo.lock"] {
        assert!(sources.iter().any(|s| s == file), "{file} is not copied");
    }
    for p in &packages {
        let dir = p.dir.to_string_lossy();
        let manifest = format!("{dir}/Cargo.toml");
        assert!(
            sources.iter().any(|s| *s == dir || *s == manifest),
            "the build stage does not copy workspace member {} ({dir})",
            p.name
        );
    }
}

#[test]
fn base_images_are_pinned_and_the_image_runs_as_non_root() {
    let stages = stages();
    let names: Vec<String> = stages.iter().filter_map(|s| from(s).1).collect();
    for stage in &stages {
        let (image, _) = from(stage);
        if names.contains(&image) {
            continue;
        }
        let last = image.rsplit('/').next().expect("image name");
        let pinned_tag = last
            .split_once(':')
            .is_some_and(|(_, tag)| !tag.is_empty() && tag != "latest");
        assert!(
            image.contains("@sha256:") || pinned_tag,
            "base image {image} is not pinned to a tag or digest"
        );
    }

    // The toolchain is at least the workspace's rust-version, and both stages are Debian 12.
    let (builder_image, _) = from(&stages[0]);
    let tag = builder_image.rsplit_once(':').expect("a tag").1;
    let rust = tag.split('-').next().expect("version part");
    let packages = workspace();
    for p in &packages {
        if let Some(min) = &p.rust_version {
            assert!(
                version_tuple(rust) >= version_tuple(min),
                "{builder_image} is older than {}'s rust-version {min}",
                p.name
            );
        }
    }
    let (runtime_image, _) = from(stages.last().expect("final stage"));
    assert!(
        runtime_image.contains("debian12") && tag.contains("bookworm"),
        "builder ({builder_image}) and runtime ({runtime_image}) must share Debian 12's glibc"
    );

    // Non-root, by number (Kubernetes' runAsNonRoot can only verify a numeric user).
    let user = stages
        .last()
        .expect("final stage")
        .iter()
        .rfind(|i| i.keyword == "USER")
        .expect("the final stage sets USER");
    let uid: u32 = user
        .args
        .split(':')
        .next()
        .expect("user")
        .parse()
        .unwrap_or_else(|_| panic!("USER {} is not numeric", user.args));
    assert_ne!(uid, 0, "the image must not run as root");

    // The Deployment runs this image, at the workspace's version, as a non-root user.
    let manager = std::fs::read_to_string(repo_root().join("config/manager/manager.yaml"))
        .expect("read config/manager/manager.yaml");
    let deployment: serde_yaml::Value = serde_yaml::from_str(&manager).expect("parse manager.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let version = &packages
        .iter()
        .find(|p| p.name == "vcluster-plugin-operator")
        .expect("operator package")
        .version;
    assert_eq!(
        container["image"].as_str(),
        Some(format!("ghcr.io/vcp-dev/vcluster-plugin-operator:{version}").as_str())
    );
    assert_eq!(
        container["command"][0].as_str(),
        Some("/usr/local/bin/vcluster-plugin-operator")
    );
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_u64(),
        Some(u64::from(uid))
    );
}

#[test]
fn dockerignore_keeps_build_outputs_out_and_the_sources_in() {
    let ignore =
        std::fs::read_to_string(repo_root().join(".dockerignore")).expect("read .dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            patterns.contains(&must),
            ".dockerignore must exclude {must}/"
        );
    }
    let stages = stages();
    for i in stages.iter().flatten().filter(|i| i.keyword == "COPY") {
        let (flags, sources, _) = copy_args(i);
        if flags.iter().any(|f| f.starts_with("--from")) {
            continue;
        }
        for source in sources {
            for pattern in &patterns {
                let excluded = source == *pattern || source.starts_with(&format!("{pattern}/"));
                assert!(
                    !excluded,
                    ".dockerignore's {pattern} excludes {source}, which the Dockerfile copies"
                );
            }
        }
    }
}
