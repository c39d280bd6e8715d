//! The container image, proven without a container engine: the `Dockerfile` replayed.
//!
//! No container engine runs where the tests run, so [`Image::build`] does, step by step on this
//! machine, what `docker build` does with the repository's `Dockerfile`:
//!
//! - **Context**: the repository as `.dockerignore` leaves it, with Docker's semantics
//!   ([`IgnoreRules`]). `COPY` reads only from it; a source it excludes is "not found", as in
//!   Docker.
//! - **Build stage** (a stage `FROM` the official `rust:<version>-slim-<debian>` image): its base
//!   image is stood in for by this machine. A scratch root filesystem gets the host's `/usr`
//!   (except `/usr/local`), `/etc` and top-level links, read-only, and the Rust toolchain where
//!   the official image keeps it: the host's `$CARGO_HOME` at `/usr/local/cargo`
//!   (read-write: cargo keeps its locks and registry there) and the host's `$RUSTUP_HOME` at
//!   `/usr/local/rustup` (read-only: the replay never installs a toolchain;
//!   `scripts/setup` installs the image's), with the official image's environment
//!   ([`rust_image_env`]; `RUSTUP_TOOLCHAIN` pins the image's Rust version, so rustup runs
//!   exactly that toolchain). `WORKDIR`, `ENV`, `ARG` defaults and `COPY` (files keep their
//!   mode and modification time, as Docker keeps them) apply to that root, and each `RUN` runs
//!   there with `/bin/sh -c`, Docker's shell form, in a private mount namespace under `chroot`
//!   with a clean environment: the machine's own `/` is never written. A
//!   `--mount=type=cache` target inside the toolchain homes (the cargo registry) is the host's
//!   own cache; any other (the cargo target folder) is a folder kept under
//!   `$VCP_CACHE_DIR/image-build/<checkout>/` (default `~/.cache/vcluster-plugin-operator`), one
//!   per checkout, so a second run is incremental and two checkouts never share build outputs.
//! - **Final stage** (any other base, such as distroless): assembled from its `COPY --from`
//!   lines into a root of its own; its base image is not fetched, and a `RUN` in it is refused.
//!   What the binaries may take from that base is stated in [`DISTROLESS_CC_LIBRARIES`] and
//!   checked by the tests; [`Image::final_user`] and [`Image::entrypoint`] are its `USER` and
//!   `ENTRYPOINT`.
//!
//! What the replay does not model (`ADD`, `SHELL`, here-documents, `RUN` in exec form, mounts
//! other than caches, `COPY` flags other than `--from`, variables in `ENV`) is refused with an
//! error naming it, never skipped. It needs root or unprivileged user namespaces (for the
//! mount namespace and `chroot`), `unshare` and `mount` (util-linux), and `readelf` (binutils).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use globset::{GlobBuilder, GlobMatcher};

/// Shared libraries the final stage's base, `gcr.io/distroless/cc-debian12`, provides: Debian
/// 12's glibc (package `libc6`: the C library, libm, libpthread, libdl, librt and the dynamic
/// loader) and `libgcc_s` (package `libgcc-s1`), per distroless's description of its `cc`
/// images ("glibc ... plus libgcc1"). By `DT_NEEDED` name; the loader by file name.
pub const DISTROLESS_CC_LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
];

/// A parsed Dockerfile: its stages in order.
#[derive(Debug, Clone)]
pub struct Dockerfile {
    /// The stages, each from its `FROM` to the next.
    pub stages: Vec<Stage>,
}

/// One stage of a Dockerfile.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The `FROM` image reference, as written.
    pub image: String,
    /// The `AS` name, if any.
    pub name: Option<String>,
    /// The instructions after `FROM`.
    pub steps: Vec<Step>,
}

/// One instruction of a stage, as far as the replay models it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `WORKDIR path`.
    Workdir(String),
    /// `ENV key=value ...`, in order.
    Env(Vec<(String, String)>),
    /// `ARG name[=default]`: a default becomes part of a later `RUN`'s environment.
    Arg(String, Option<String>),
    /// `COPY [--from=stage] src... dest`.
    Copy {
        /// `--from`: a stage name (or index); `None` copies from the build context.
        from: Option<String>,
        /// The sources, as written.
        sources: Vec<String>,
        /// The destination, as written (relative to `WORKDIR` unless absolute).
        dest: String,
    },
    /// `RUN [--mount=type=cache,target=...]... command` in shell form.
    Run {
        /// The cache mounts: (cache id, target). BuildKit's id defaults to the target.
        cache_mounts: Vec<(String, String)>,
        /// The command given to `/bin/sh -c`, line continuations removed.
        command: String,
    },
    /// `USER user[:group]`.
    User(String),
    /// `ENTRYPOINT [...]` in exec form.
    Entrypoint(Vec<String>),
    /// An instruction that sets image metadata only (`LABEL`, `EXPOSE`, `CMD`, ...), by keyword.
    Metadata(&'static str),
}

impl Dockerfile {
    /// Parses a Dockerfile's text (with the `parse-dockerfile` crate) into the steps the replay
    /// models.
    ///
    /// # Errors
    /// A syntax error, or an instruction, flag or form the replay does not model (named).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let parsed = parse_dockerfile::parse(text).map_err(|e| anyhow!("Dockerfile: {e}"))?;
        if let Some(escape) = &parsed.parser_directives.escape {
            ensure!(
                escape.value.value == '\\',
                "Dockerfile: the escape directive is not modelled"
            );
        }
        let mut stages = Vec::new();
        for stage in parsed.stages() {
            ensure!(
                stage.from.options.is_empty(),
                "FROM with flags (--platform) is not modelled"
            );
            let steps = stage
                .instructions
                .iter()
                .map(step)
                .collect::<anyhow::Result<Vec<_>>>()?;
            stages.push(Stage {
                image: stage.from.image.value.to_string(),
                name: stage.from.as_.as_ref().map(|(_, n)| n.value.to_string()),
                steps,
            });
        }
        Ok(Dockerfile { stages })
    }

    /// The index of the stage called `name` (an `AS` name or a number, as `COPY --from` takes).
    pub fn stage_index(&self, name: &str) -> Option<usize> {
        self.stages
            .iter()
            .position(|s| s.name.as_deref() == Some(name))
            .or_else(|| name.parse().ok().filter(|i| *i < self.stages.len()))
    }
}

fn step(instruction: &parse_dockerfile::Instruction<'_>) -> anyhow::Result<Step> {
    use parse_dockerfile::{Command as Cmd, Instruction as I, Source};
    Ok(match instruction {
        I::Workdir(w) => Step::Workdir(w.arguments.value.to_string()),
        I::Env(e) => Step::Env(env_pairs(&e.arguments.value)?),
        I::Arg(a) => {
            let words = shlex::split(&a.arguments.value)
                .ok_or_else(|| anyhow!("ARG {}: unbalanced quotes", a.arguments.value))?;
            ensure!(words.len() == 1, "ARG with several names is not modelled");
            match words[0].split_once('=') {
                Some((k, v)) => Step::Arg(k.to_string(), Some(no_variables(v)?.to_string())),
                None => Step::Arg(words[0].clone(), None),
            }
        }
        I::Copy(c) => {
            let mut from = None;
            for flag in &c.options {
                match (flag.name.value.as_ref(), &flag.value) {
                    ("from", Some(v)) => from = Some(v.value.to_string()),
                    (name, _) => bail!("COPY --{name} is not modelled"),
                }
            }
            let sources = c
                .src
                .iter()
                .map(|s| match s {
                    Source::Path(p) => Ok(p.value.to_string()),
                    _ => Err(anyhow!("COPY from a here-document is not modelled")),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Step::Copy {
                from,
                sources,
                dest: c.dest.value.to_string(),
            }
        }
        I::Run(r) => {
            ensure!(
                r.here_docs.is_empty(),
                "RUN with a here-document is not modelled"
            );
            let mut cache_mounts = Vec::new();
            for flag in &r.options {
                let value = flag.value.as_ref().map_or("", |v| v.value.as_ref());
                match flag.name.value.as_ref() {
                    "mount" => cache_mounts.push(cache_mount(value)?),
                    other => bail!("RUN --{other} is not modelled"),
                }
            }
            let command = match &r.arguments {
                Cmd::Shell(s) => shell_command(s.value)?,
                _ => bail!("RUN in exec form is not modelled"),
            };
            Step::Run {
                cache_mounts,
                command,
            }
        }
        I::User(u) => Step::User(u.arguments.value.to_string()),
        I::Entrypoint(e) => match &e.arguments {
            Cmd::Exec(args) => {
                Step::Entrypoint(args.value.iter().map(|a| a.value.to_string()).collect())
            }
            // Shell form would need /bin/sh in the final image (distroless has none).
            _ => bail!("ENTRYPOINT in shell form is not modelled"),
        },
        I::Label(_) => Step::Metadata("LABEL"),
        I::Expose(_) => Step::Metadata("EXPOSE"),
        I::Cmd(_) => Step::Metadata("CMD"),
        I::Stopsignal(_) => Step::Metadata("STOPSIGNAL"),
        I::Healthcheck(_) => Step::Metadata("HEALTHCHECK"),
        I::Maintainer(_) => Step::Metadata("MAINTAINER"),
        other => bail!("{other:?} is not modelled by the replay"),
    })
}

/// `ENV` arguments as (key, value) pairs: `k=v ...` with shell quoting, or the legacy `k v`.
fn env_pairs(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let words = shlex::split(text).ok_or_else(|| anyhow!("ENV {text}: unbalanced quotes"))?;
    ensure!(!words.is_empty(), "ENV without arguments");
    let pairs = if words[0].contains('=') {
        words
            .iter()
            .map(|w| {
                w.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| anyhow!("ENV {text}: {w} is not key=value"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    } else {
        vec![(words[0].clone(), words[1..].join(" "))]
    };
    for (_, v) in &pairs {
        no_variables(v)?;
    }
    Ok(pairs)
}

fn no_variables(value: &str) -> anyhow::Result<&str> {
    ensure!(
        !value.contains('$'),
        "variable substitution ({value}) is not modelled"
    );
    Ok(value)
}

/// `--mount=type=cache,target=...[,id=...]` → (id, target).
fn cache_mount(spec: &str) -> anyhow::Result<(String, String)> {
    let mut kind = None;
    let mut target = None;
    let mut id = None;
    for field in spec.split(',') {
        let (k, v) = field.split_once('=').unwrap_or((field, ""));
        match k {
            "type" => kind = Some(v),
            "target" | "dst" | "destination" => target = Some(v.to_string()),
            "id" => id = Some(v.to_string()),
            // How concurrent builds share the cache and who owns it: no effect on one build.
            "sharing" | "mode" | "uid" | "gid" => {}
            other => bail!("--mount={spec}: option {other} is not modelled"),
        }
    }
    ensure!(
        kind == Some("cache"),
        "--mount={spec}: only type=cache is modelled"
    );
    let target = target.ok_or_else(|| anyhow!("--mount={spec}: no target"))?;
    ensure!(
        target.starts_with('/'),
        "--mount={spec}: a relative target is not modelled"
    );
    Ok((id.unwrap_or_else(|| target.clone()), target))
}

/// A shell-form command as Docker hands it to the shell: line continuations removed.
fn shell_command(raw: &str) -> anyhow::Result<String> {
    let command = raw.replace("\\\r\n", "").replace("\\\n", "");
    ensure!(
        !command.lines().any(|l| l.trim_start().starts_with('#')),
        "a comment line inside a RUN is not modelled: {raw}"
    );
    Ok(command.trim().to_string())
}

/// The patterns of a `.dockerignore` file, applied as Docker applies them.
///
/// Per line: a line starting with `#` is a comment; the rest is trimmed, blank lines skipped; a
/// leading `!` makes an exception. The pattern is cleaned like Go's `filepath.Clean` and a
/// leading `/` dropped (`/foo`, `./foo` and `foo/` all mean `foo`). A pattern applies to a path
/// when it matches the path or any of its parent folders (so `target/` excludes everything under
/// it), and the last pattern that applies decides. The glob is Go's `filepath.Match` plus `**`:
/// `*` and `?` never match `/`, `**/` matches any number of folders, also none. Source: Docker's
/// `.dockerignore` reference and moby's `patternmatcher`. Glob matching is `globset`'s; the two
/// constructs the two syntaxes read differently (`{a,b}`, `[!...]`) are refused.
#[derive(Debug, Clone, Default)]
pub struct IgnoreRules {
    rules: Vec<IgnoreRule>,
}

#[derive(Debug, Clone)]
struct IgnoreRule {
    matcher: GlobMatcher,
    exception: bool,
}

impl IgnoreRules {
    /// Parses a `.dockerignore` file's text.
    ///
    /// # Errors
    /// A bare `!`, an invalid glob, or a construct read differently by Go and `globset`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut rules = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let mut pattern = line.trim();
            if pattern.is_empty() {
                continue;
            }
            let exception = pattern.starts_with('!');
            if exception {
                pattern = pattern[1..].trim();
                ensure!(
                    !pattern.is_empty(),
                    ".dockerignore: illegal exclusion pattern \"!\""
                );
            }
            let mut pattern = clean(pattern);
            if pattern.len() > 1 && pattern.starts_with('/') {
                pattern.remove(0);
            }
            ensure!(
                !pattern.contains('{') && !pattern.contains("[!"),
                ".dockerignore: {pattern}: `{{` and `[!` mean other things to Docker than to \
                 globset; not modelled"
            );
            let matcher = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .with_context(|| format!(".dockerignore: {pattern}"))?
                .compile_matcher();
            rules.push(IgnoreRule { matcher, exception });
        }
        Ok(IgnoreRules { rules })
    }

    /// Whether `path` (relative to the context root, `/`-separated) is left out of the context.
    pub fn excludes(&self, path: &str) -> bool {
        let mut excluded = false;
        for rule in &self.rules {
            let mut candidate = path;
            let matched = loop {
                if rule.matcher.is_match(candidate) {
                    break true;
                }
                match candidate.rfind('/') {
                    Some(i) => candidate = &candidate[..i],
                    None => break false,
                }
            };
            if matched {
                excluded = !rule.exception;
            }
        }
        excluded
    }

    /// Whether any pattern is an exception (`!`): then an excluded folder may hold included files.
    pub fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|r| r.exception)
    }
}

/// Go's `filepath.Clean` on a `/`-separated path.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// The environment the official `rust` image (`docker-library/rust`) sets, for Rust `version`.
pub fn rust_image_env(version: &str) -> Vec<(String, String)> {
    [
        ("RUSTUP_HOME", "/usr/local/rustup"),
        ("CARGO_HOME", "/usr/local/cargo"),
        (
            "PATH",
            "/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("RUST_VERSION", version),
        // Not set by the image, which has only this toolchain: makes rustup on the host run
        // the same version (`scripts/setup` installs it), and never install one itself (the
        // host's rustup home is mounted read-only).
        ("RUSTUP_TOOLCHAIN", version),
        ("RUSTUP_AUTO_INSTALL", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `rust:<version>-[slim-]<debian>` (any registry prefix) → (version, Debian codename).
fn rust_base(image: &str) -> Option<(String, String)> {
    let last = image.rsplit('/').next()?;
    let tag = last.strip_prefix("rust:")?;
    let mut parts = tag.split('-');
    let version = parts.next()?.to_string();
    let codename = parts.next_back()?.to_string();
    Some((version, codename))
}

/// The outcome of a replayed `docker build`.
#[derive(Debug)]
pub struct Image {
    /// The Dockerfile replayed.
    pub dockerfile: Dockerfile,
    /// This run's scratch folder: each stage's root filesystem (`stage-<i>`) and the `RUN` logs.
    pub dir: PathBuf,
    /// Each stage's root filesystem, by stage index. For the build stage it holds what its
    /// `COPY` and `RUN` steps wrote outside the cache mounts (as in Docker, a cache mount is not
    /// part of the stage).
    pub roots: Vec<PathBuf>,
    /// Wall time of all `RUN` steps.
    pub run_time: Duration,
    /// Each stage's `USER`, `ENTRYPOINT` and `ENV` after its last step, by stage index.
    configs: Vec<StageConfig>,
}

#[derive(Debug, Clone, Default)]
struct StageConfig {
    workdir: String,
    env: BTreeMap<String, String>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
}

/// Prefix of the scratch folders in the temporary folder: `vcp-image-<pid>`.
const SCRATCH_PREFIX: &str = "vcp-image-";

impl Image {
    /// Replays `docker build` of `repo/Dockerfile` with `repo` as the context (see the module
    /// documentation), every stage in order.
    ///
    /// # Errors
    /// Whatever would fail `docker build` (a `COPY` source missing from the context, a `RUN`
    /// exiting non-zero: its log's tail is in the error), or a step the replay does not model.
    pub fn build(repo: &Path) -> anyhow::Result<Image> {
        let text = std::fs::read_to_string(repo.join("Dockerfile")).context("read Dockerfile")?;
        let dockerfile = Dockerfile::parse(&text)?;
        let ignore = match std::fs::read_to_string(repo.join(".dockerignore")) {
            Ok(text) => IgnoreRules::parse(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => IgnoreRules::default(),
            Err(e) => return Err(e).context("read .dockerignore"),
        };
        let context = BuildContext {
            root: repo.to_path_buf(),
            ignore,
        };
        let tmp = std::env::temp_dir();
        remove_stale_scratch(&tmp);
        let dir = tmp.join(format!("{SCRATCH_PREFIX}{}", std::process::id()));
        if dir.exists() {
            remove_unmounted(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let cache = cache_dir()?.join("image-build").join(checkout_key(repo)?);
        let mut image = Image {
            dockerfile: dockerfile.clone(),
            dir: dir.clone(),
            roots: Vec::new(),
            run_time: Duration::ZERO,
            configs: Vec::new(),
        };
        for (index, stage) in dockerfile.stages.iter().enumerate() {
            let root = dir.join(format!("stage-{index}"));
            std::fs::create_dir_all(&root)?;
            image.roots.push(root.clone());
            let config = image
                .replay_stage(index, stage, &root, &context, &cache)
                .with_context(|| {
                    format!("stage {index} (FROM {}{})", stage.image, {
                        stage
                            .name
                            .as_ref()
                            .map(|n| format!(" AS {n}"))
                            .unwrap_or_default()
                    })
                })?;
            image.configs.push(config);
        }
        Ok(image)
    }

    fn replay_stage(
        &mut self,
        index: usize,
        stage: &Stage,
        root: &Path,
        context: &BuildContext,
        cache: &Path,
    ) -> anyhow::Result<StageConfig> {
        ensure!(
            self.dockerfile.stage_index(&stage.image).is_none(),
            "FROM an earlier stage is not modelled"
        );
        let base = rust_base(&stage.image);
        let mut config = StageConfig {
            workdir: "/".into(),
            ..StageConfig::default()
        };
        if let Some((version, _)) = &base {
            config.env.extend(rust_image_env(version));
        }
        let mut args: BTreeMap<String, String> = BTreeMap::new();
        let mut runs = 0;
        for step in &stage.steps {
            match step {
                Step::Workdir(path) => {
                    config.workdir = resolve(&config.workdir, path);
                    std::fs::create_dir_all(inside(root, &config.workdir))?;
                }
                Step::Env(pairs) => config.env.extend(pairs.iter().cloned()),
                Step::Arg(name, default) => {
                    if let Some(default) = default {
                        args.insert(name.clone(), default.clone());
                    }
                }
                Step::Copy {
                    from,
                    sources,
                    dest,
                } => {
                    let dest_path = resolve(&config.workdir, dest);
                    let into_dir = dest.ends_with('/') || sources.len() > 1;
                    for source in sources {
                        ensure!(
                            !source.contains(['*', '?', '[']),
                            "COPY {source}: wildcards are not modelled"
                        );
                        match from {
                            None => context.copy(source, root, &dest_path, into_dir)?,
                            Some(stage_name) => {
                                let from = self
                                    .dockerfile
                                    .stage_index(stage_name)
                                    .filter(|i| *i < index)
                                    .ok_or_else(|| {
                                        anyhow!("COPY --from={stage_name}: no earlier such stage")
                                    })?;
                                let source_path = resolve("/", source);
                                let source_host = inside(&self.roots[from], &source_path);
                                ensure!(
                                    source_host.symlink_metadata().is_ok(),
                                    "COPY --from={stage_name} {source}: not found in that stage"
                                );
                                copy_tree(&source_host, root, &dest_path, into_dir, &|_| false)?;
                            }
                        }
                    }
                }
                Step::Run {
                    cache_mounts,
                    command,
                } => {
                    let Some((version, codename)) = &base else {
                        bail!(
                            "RUN in a stage FROM {}: only the rust image is stood in for",
                            stage.image
                        );
                    };
                    if let Some(host) = host_codename()
                        && host != *codename
                    {
                        eprintln!(
                            "image: note: the build stage is Debian {codename}, this machine is \
                             {host}; the replay links against this machine's C library"
                        );
                    }
                    let mut env = config.env.clone();
                    for (k, v) in &args {
                        env.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                    env.entry("HOME".into()).or_insert_with(|| "/root".into());
                    runs += 1;
                    let log = self.dir.join(format!("stage-{index}-run-{runs}.log"));
                    let started = Instant::now();
                    run_in_rust_root(
                        root,
                        &config.workdir,
                        &env,
                        cache_mounts,
                        cache,
                        command,
                        &log,
                    )
                    .with_context(|| format!("RUN {command} (rust {version} stood in for)"))?;
                    self.run_time += started.elapsed();
                }
                Step::User(user) => config.user = Some(user.clone()),
                Step::Entrypoint(argv) => config.entrypoint = Some(argv.clone()),
                Step::Metadata(_) => {}
            }
        }
        Ok(config)
    }

    /// The last stage's root filesystem: what the image holds, apart from its base image.
    pub fn final_root(&self) -> &Path {
        self.roots.last().expect("a Dockerfile has a stage")
    }

    /// The last stage's `USER`, as written.
    pub fn final_user(&self) -> Option<&str> {
        self.configs.last().and_then(|c| c.user.as_deref())
    }

    /// The last stage's `ENTRYPOINT`.
    pub fn entrypoint(&self) -> Option<&[String]> {
        self.configs.last().and_then(|c| c.entrypoint.as_deref())
    }

    /// The final stage's `COPY --from=<stage>` lines: (stage index, source, destination).
    pub fn final_copies(&self) -> Vec<(usize, String, String)> {
        let stage = self.dockerfile.stages.last().expect("a stage");
        let mut copies = Vec::new();
        for step in &stage.steps {
            if let Step::Copy {
                from: Some(from),
                sources,
                dest,
            } = step
            {
                let index = self.dockerfile.stage_index(from).expect("checked by build");
                for source in sources {
                    copies.push((index, source.clone(), dest.clone()));
                }
            }
        }
        copies
    }
}

/// The build context: a folder and its `.dockerignore`.
struct BuildContext {
    root: PathBuf,
    ignore: IgnoreRules,
}

impl BuildContext {
    /// `COPY source dest` from the context into `stage_root` (Docker's rules: a folder's
    /// contents are copied, not the folder; a file goes to `dest`, or into it when `into_dir`).
    fn copy(
        &self,
        source: &str,
        stage_root: &Path,
        dest: &str,
        into_dir: bool,
    ) -> anyhow::Result<()> {
        let relative = clean(source.trim_start_matches('/'));
        ensure!(
            relative != ".." && !relative.starts_with("../"),
            "COPY {source}: outside the build context"
        );
        let host = if relative == "." {
            self.root.clone()
        } else {
            self.root.join(&relative)
        };
        let missing = host.symlink_metadata().is_err();
        ensure!(
            relative == "." || (!missing && !self.ignore.excludes(&relative)),
            "COPY {source}: not found in the build context (missing or excluded by \
             .dockerignore), as `docker build` reports it"
        );
        let excluded = |path: &Path| -> bool {
            let rel = path
                .strip_prefix(&self.root)
                .expect("inside the context")
                .to_string_lossy()
                .into_owned();
            !rel.is_empty() && self.ignore.excludes(&rel)
        };
        let prune = !self.ignore.has_exceptions();
        copy_tree(&host, stage_root, dest, into_dir, &|p| {
            excluded(p) && (prune || !p.is_dir())
        })
    }
}

/// Copies `source` (file, link or folder) to `dest` inside `stage_root` as `COPY` does, keeping
/// modes and modification times; `skip` leaves a path (and, for a folder, all below it) out.
fn copy_tree(
    source: &Path,
    stage_root: &Path,
    dest: &str,
    into_dir: bool,
    skip: &dyn Fn(&Path) -> bool,
) -> anyhow::Result<()> {
    let meta = source.symlink_metadata()?;
    let dest_host = inside(stage_root, dest);
    if meta.is_dir() {
        std::fs::create_dir_all(&dest_host)?;
        copy_dir_contents(source, &dest_host, skip)
    } else {
        let target = if into_dir || dest_host.is_dir() {
            std::fs::create_dir_all(&dest_host)?;
            dest_host.join(source.file_name().expect("a file name"))
        } else {
            if let Some(parent) = dest_host.parent() {
                std::fs::create_dir_all(parent)?;
            }
            dest_host
        };
        copy_entry(source, &target)
    }
}

fn copy_dir_contents(from: &Path, to: &Path, skip: &dyn Fn(&Path) -> bool) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let path = entry?.path();
        if skip(&path) {
            continue;
        }
        let target = to.join(path.file_name().expect("a name"));
        if path.symlink_metadata()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            std::fs::set_permissions(&target, path.metadata()?.permissions())?;
            copy_dir_contents(&path, &target, skip)?;
        } else {
            copy_entry(&path, &target)?;
        }
    }
    Ok(())
}

/// One file (mode and modification time kept) or symbolic link (copied as a link).
fn copy_entry(from: &Path, to: &Path) -> anyhow::Result<()> {
    let meta = from.symlink_metadata()?;
    if to.symlink_metadata().is_ok() {
        std::fs::remove_file(to)?;
    }
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
    } else {
        std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
        std::fs::File::options()
            .write(true)
            .open(to)?
            .set_modified(meta.modified()?)?;
    }
    Ok(())
}

/// `path` resolved against `workdir` (Docker: a relative path is relative to `WORKDIR`).
fn resolve(workdir: &str, path: &str) -> String {
    if path.starts_with('/') {
        clean(path)
    } else {
        clean(&format!("{workdir}/{path}"))
    }
}

/// The host path of absolute `path` inside the root filesystem `root`.
fn inside(root: &Path, path: &str) -> PathBuf {
    let mut host = root.to_path_buf();
    for component in Path::new(&clean(path)).components() {
        if let Component::Normal(c) = component {
            host.push(c);
        }
    }
    host
}

/// `$VCP_CACHE_DIR`, else `${XDG_CACHE_HOME:-$HOME/.cache}/vcluster-plugin-operator` (as
/// `scripts/control-plane`): where the build caches the tests keep between runs live.
///
/// # Errors
/// When neither `VCP_CACHE_DIR`, `XDG_CACHE_HOME` nor `HOME` is set.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("VCP_CACHE_DIR") {
        return Ok(dir.into());
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").ok_or_else(|| anyhow!("HOME is unset"))?)
            .join(".cache"),
    };
    Ok(base.join("vcluster-plugin-operator"))
}

/// A folder name for a checkout: its path, `/` → `-` (a cache of one checkout's builds never
/// serves another's).
///
/// # Errors
/// When the path cannot be resolved.
pub fn checkout_key(repo: &Path) -> anyhow::Result<String> {
    let path = repo.canonicalize()?;
    Ok(path
        .to_string_lossy()
        .trim_start_matches('/')
        .replace(['/', ' '], "-"))
}

fn host_codename() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
}

fn home_of(var: &str, default: &str) -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").ok_or_else(|| anyhow!("HOME is unset"))?)
            .join(default),
    };
    path.canonicalize()
        .with_context(|| format!("${var} ({}): the Rust toolchain", path.display()))
}

/// The canonical host folders of the toolchains in `rustup_home/toolchains` that are symbolic
/// links (each once, in name order).
///
/// # Errors
/// When the folder cannot be read or a link does not resolve.
fn linked_toolchains(rustup_home: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = rustup_home.join("toolchains");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let mut targets = Vec::new();
    for entry in entries {
        if entry.file_type()?.is_symlink() {
            let target = entry
                .path()
                .canonicalize()
                .with_context(|| format!("the toolchain link {}", entry.path().display()))?;
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
    }
    Ok(targets)
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The mounts of the stand-in for the rust image, made in a private mount namespace.
const MOUNT_SCRIPT: &str = r#"set -eu
root=$1 workdir=$2
shift 2
while [ "$1" != -- ]; do
  mount --rbind "$1" "$root$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
  shift 3
done
shift
exec chroot "$root" /usr/bin/env -i -C "$workdir" "$@"
"#;

/// Runs `command` with `/bin/sh -c` in `root` standing for the rust image (see the module
/// documentation), output to `log`.
fn run_in_rust_root(
    root: &Path,
    workdir: &str,
    env: &BTreeMap<String, String>,
    cache_mounts: &[(String, String)],
    cache: &Path,
    command: &str,
    log: &Path,
) -> anyhow::Result<()> {
    let cargo_home = home_of("CARGO_HOME", ".cargo")?;
    let rustup_home = home_of("RUSTUP_HOME", ".rustup")?;
    // (host source, path in the root, ro|rw)
    let mut mounts: Vec<(PathBuf, String, &str)> = Vec::new();
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"] {
        let host = Path::new("/").join(name);
        let Ok(meta) = host.symlink_metadata() else {
            continue;
        };
        let in_root = root.join(name);
        if meta.file_type().is_symlink() {
            if in_root.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(std::fs::read_link(&host)?, &in_root)?;
            }
        } else {
            std::fs::create_dir_all(&in_root)?;
            mounts.push((host, format!("/{name}"), "ro"));
        }
    }
    for entry in std::fs::read_dir("/usr")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "local" || !entry.path().is_dir() {
            continue;
        }
        std::fs::create_dir_all(root.join("usr").join(&name))?;
        mounts.push((entry.path(), format!("/usr/{name}"), "ro"));
    }
    for dir in ["usr/local/bin", "usr/local/sbin", "root", "dev", "proc"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    // The toolchain, read-only; cargo's home read-write, as cargo writes its locks and caches
    // there (the image's is writable too).
    let linked = linked_toolchains(&rustup_home)?;
    for (host, in_root, mode) in [
        (cargo_home.clone(), "/usr/local/cargo", "rw"),
        (rustup_home, "/usr/local/rustup", "ro"),
    ] {
        std::fs::create_dir_all(inside(root, in_root))?;
        mounts.push((host, in_root.to_string(), mode));
    }
    // A toolchain that is a link (`rustup toolchain link`, or a version name linked to
    // `stable`) points to an absolute host path: it is mounted there too, read-only, or rustup
    // in the root finds a dangling link and reports the toolchain "not installed" (seen on a
    // fresh machine whose `1.95.0-…` toolchain links to `stable-…`).
    for target in linked {
        let in_root = target.to_string_lossy().into_owned();
        std::fs::create_dir_all(inside(root, &in_root))?;
        mounts.push((target, in_root, "ro"));
    }
    mounts.push(("/dev".into(), "/dev".into(), "rw"));
    mounts.push(("/proc".into(), "/proc".into(), "rw"));
    for (id, target) in cache_mounts {
        let target = clean(target);
        if target == "/usr/local/cargo" || target.starts_with("/usr/local/cargo/") {
            // Inside the toolchain home, which is the host's: its cache already.
            continue;
        }
        let host = cache.join("cache").join(
            id.trim_matches('/')
                .replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "-"),
        );
        std::fs::create_dir_all(&host)?;
        std::fs::create_dir_all(inside(root, &target))?;
        mounts.push((host, target, "rw"));
    }

    let mut cmd = Command::new("unshare");
    if !is_root() {
        cmd.args(["--user", "--map-root-user"]);
    }
    cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(MOUNT_SCRIPT)
        .arg("replay")
        .arg(root)
        .arg(workdir);
    for (host, in_root, mode) in &mounts {
        cmd.arg(host).arg(in_root).arg(mode);
    }
    cmd.arg("--");
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.args(["/bin/sh", "-c", command]);
    let out = std::fs::File::create(log)?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .context("run unshare (util-linux)")?;
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let mut message = format!("exited with {status}; log {}:\n", log.display());
        for line in tail.iter().rev() {
            let _ = writeln!(message, "  {line}");
        }
        bail!(message);
    }
    Ok(())
}

/// Runs `argv` with `root` as its root filesystem and nothing else (no `/proc`, no `/dev`), as
/// user `uid:gid`, with an empty environment: as root with `chroot --userspec`, otherwise in a
/// user namespace mapping the caller to that user.
///
/// A file just written cannot be executed while another thread's child, forked before it
/// `exec`s, still holds the inherited write descriptor (`ETXTBSY`, "Text file busy"): the test
/// threads copy binaries and start processes concurrently, so that refusal is retried for up to
/// a second.
///
/// # Errors
/// When the command cannot be started.
pub fn run_in_root(root: &Path, uid: u32, gid: u32, argv: &[&str]) -> anyhow::Result<Output> {
    let mut attempts = 0;
    loop {
        let out = run_in_root_once(root, uid, gid, argv)?;
        attempts += 1;
        if attempts == 10 || !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            return Ok(out);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_in_root_once(root: &Path, uid: u32, gid: u32, argv: &[&str]) -> anyhow::Result<Output> {
    // The program is looked up in this process's PATH: the child's environment is empty.
    let mut cmd = if is_root() {
        let mut cmd = Command::new(host_program("chroot")?);
        cmd.arg(format!("--userspec={uid}:{gid}")).arg(root);
        cmd
    } else {
        let mut cmd = Command::new(host_program("unshare")?);
        cmd.args(["--user", &format!("--map-user={uid}")])
            .arg(format!("--map-group={gid}"))
            .arg(format!("--root={}", root.display()))
            .arg("--wd=/");
        cmd
    };
    cmd.args(argv)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {argv:?} in {}", root.display()))
}

/// The path of program `name` in this process's `PATH`.
fn host_program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("{name} is not in PATH"))
}

/// An ELF file's dynamic needs: its `DT_NEEDED` libraries and its program interpreter (`None`
/// for a static executable), read with `readelf` (binutils).
///
/// # Errors
/// When `readelf` cannot run or fails on the file.
pub fn dynamic_needs(binary: &Path) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let out = Command::new("readelf")
        .args(["--wide", "--dynamic", "--program-headers"])
        .arg(binary)
        .output()
        .context("run readelf (binutils)")?;
    ensure!(
        out.status.success(),
        "readelf {}: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let needed = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split_once("Shared library: [")?.1.split_once(']'))
        .map(|(name, _)| name.to_string())
        .collect();
    let interpreter = text
        .lines()
        .find_map(|l| {
            l.split_once("[Requesting program interpreter: ")?
                .1
                .split_once(']')
        })
        .map(|(path, _)| path.to_string());
    Ok((needed, interpreter))
}

/// Copies into `root` the libraries `binary` needs, from this machine, at the paths the dynamic
/// loader finds them (`ldd`), and its interpreter: a root where a dynamic binary can start. Does
/// nothing for a static binary.
///
/// # Errors
/// When `ldd` fails or a library is not found.
pub fn provide_libraries(binary: &Path, root: &Path) -> anyhow::Result<Vec<String>> {
    let (needed, interpreter) = dynamic_needs(binary)?;
    let Some(interpreter) = interpreter else {
        return Ok(Vec::new());
    };
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut copied = Vec::new();
    let loader = Path::new(&interpreter)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let mut paths = vec![interpreter];
    // The loader may be needed by name too (for `__tls_get_addr`): it is the interpreter.
    for name in needed
        .iter()
        .filter(|n| Some(n.as_str()) != loader.as_deref())
    {
        let path = text
            .lines()
            .find_map(|l| {
                let (soname, rest) = l.trim().split_once(" => ")?;
                (soname == name).then(|| rest.split_whitespace().next().map(str::to_string))?
            })
            .ok_or_else(|| anyhow!("ldd does not resolve {name} for {}", binary.display()))?;
        paths.push(path);
    }
    for path in paths {
        let target = inside(root, &path);
        std::fs::create_dir_all(target.parent().expect("a folder"))?;
        std::fs::copy(&path, &target).with_context(|| format!("copy {path}"))?;
        copied.push(path);
    }
    Ok(copied)
}

/// Removes the scratch folders of test processes that no longer run.
fn remove_stale_scratch(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = remove_unmounted(&entry.path());
        }
    }
}

/// Removes `dir`, unless something is mounted below it in this mount namespace (the build
/// stage's mounts live in a namespace of their own; should one ever be visible here, removing
/// would reach into the host's folders).
fn remove_unmounted(dir: &Path) -> anyhow::Result<()> {
    let dir = dir.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    if let Some(line) = mounts.lines().find(|l| {
        l.split_whitespace()
            .nth(4)
            .is_some_and(|m| m.starts_with(&prefix) || Path::new(m) == dir)
    }) {
        bail!("{} holds a mount ({line}); not removing it", dir.display());
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of Docker's `.dockerignore` reference ("Build context", dockerignore files).
    #[test]
    fn dockerignore_follows_the_examples_of_dockers_reference() {
        let rules = IgnoreRules::parse("# comment\n*/temp*\n*/*/temp*\ntemp?\n").unwrap();
        assert!(rules.excludes("somedir/temporary.txt"));
        assert!(rules.excludes("somedir/temp"));
        assert!(rules.excludes("somedir/subdir/temporary.txt"));
        assert!(rules.excludes("tempa"));
        assert!(rules.excludes("tempb"));
        assert!(!rules.excludes("temporary.txt"), "*/temp* needs a folder");
        assert!(!rules.excludes("a/b/c/temp"), "* stops at /");

        let rules = IgnoreRules::parse("**/*.go\n").unwrap();
        assert!(rules.excludes("main.go"), "**/ matches no folder too");
        assert!(rules.excludes("a/b/c.go"));

        // Exceptions: the last matching line decides.
        let rules = IgnoreRules::parse("*.md\n!README*.md\nREADME-secret.md\n").unwrap();
        assert!(rules.excludes("CHANGES.md"));
        assert!(!rules.excludes("README.md"));
        assert!(rules.excludes("README-secret.md"));
        let rules = IgnoreRules::parse("*.md\nREADME-secret.md\n!README*.md\n").unwrap();
        assert!(!rules.excludes("README-secret.md"));
    }

    #[test]
    fn dockerignore_cleans_patterns_and_excludes_below_a_matched_folder() {
        let rules =
            IgnoreRules::parse("/target/\n./.git\n  # not a comment\ntests//tests/\n").unwrap();
        for path in [
            "target",
            "target/release/x",
            ".git/HEAD",
            "tests/tests/a.rs",
        ] {
            assert!(rules.excludes(path), "{path}");
        }
        for path in ["tests/src/lib.rs", "crds/target.rs", "a/target"] {
            assert!(!rules.excludes(path), "{path}");
        }
        assert!(rules.excludes("# not a comment"));
        assert!(IgnoreRules::parse("!\n").is_err());
        assert!(IgnoreRules::parse("{a,b}\n").is_err());
    }

    #[test]
    fn go_clean() {
        for (input, cleaned) in [
            ("a/b/", "a/b"),
            ("./a", "a"),
            ("a//b", "a/b"),
            ("a/../b", "b"),
            ("../a", "../a"),
            ("/../a", "/a"),
            ("", "."),
            ("/", "/"),
        ] {
            assert_eq!(clean(input), cleaned, "{input}");
        }
    }

    #[test]
    fn parses_the_instructions_the_replay_models() {
        let dockerfile = Dockerfile::parse(
            "# syntax=docker/dockerfile:1\nFROM rust:1.95.0-slim-bookworm AS b\nWORKDIR /src\n\
             ENV A=1 \\\n    B=\"two words\"\nCOPY x y ./\n\
             RUN --mount=type=cache,target=/src/target \\\n    echo a \\\n    && echo b\n\
             FROM scratch\nARG V=1\nCOPY --from=b /out/x /x\nUSER 1:2\nENTRYPOINT [\"/x\"]\n",
        )
        .unwrap();
        let [builder, last] = dockerfile.stages.as_slice() else {
            panic!("two stages: {dockerfile:?}")
        };
        assert_eq!(
            rust_base(&builder.image),
            Some(("1.95.0".into(), "bookworm".into()))
        );
        assert_eq!(
            builder.steps,
            vec![
                Step::Workdir("/src".into()),
                Step::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into())
                ]),
                Step::Copy {
                    from: None,
                    sources: vec!["x".into(), "y".into()],
                    dest: "./".into()
                },
                Step::Run {
                    cache_mounts: vec![("/src/target".into(), "/src/target".into())],
                    command: "echo a     && echo b".into()
                },
            ]
        );
        assert_eq!(
            last.steps,
            vec![
                Step::Arg("V".into(), Some("1".into())),
                Step::Copy {
                    from: Some("b".into()),
                    sources: vec!["/out/x".into()],
                    dest: "/x".into()
                },
                Step::User("1:2".into()),
                Step::Entrypoint(vec!["/x".into()]),
            ]
        );
        assert_eq!(dockerfile.stage_index("b"), Some(0));
        for unmodelled in [
            "FROM a\nADD x /y\n",
            "FROM a\nSHELL [\"/bin/bash\", \"-c\"]\n",
            "FROM a\nRUN [\"echo\"]\n",
            "FROM a\nRUN --mount=type=secret,id=x true\n",
            "FROM a\nCOPY --chown=1 x /y\n",
            "FROM a\nENV A=$B\n",
        ] {
            assert!(Dockerfile::parse(unmodelled).is_err(), "{unmodelled}");
        }
    }
}
