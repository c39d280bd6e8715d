//! vCluster's translation rules asked of vCluster's own code: the translate oracle
//! (`tests/vcluster-go/cmd/translate-oracle`, built by `scripts/oracles build` against the pinned
//! `github.com/loft-sh/vcluster`), for the expected values of end-to-end tests (the host name of
//! a referenced object, the host selector of a `labels` patch). `tests/tests/oracle_translate.rs`
//! compares the runtime's translation with the same oracle case by case. Kubernetes' guess of a
//! kind's plural is asked of Kubernetes' own code the same way ([`kubernetes_plurals`]).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::fixtures::{VCLUSTER_VERSIONS, oracle_path_at, oracle_paths};

/// Runs the line oracle `program` (a Go driver of `tests/vcluster-go/cmd` that reads one
/// request per line on stdin and writes one JSON answer per line) on `requests`, in one process,
/// and returns its answers in order. `what` names it in failures.
///
/// # Panics
/// When it cannot be started, exits non-zero (its stderr is in the panic), answers something
/// that is not JSON, or answers another number of lines than asked.
pub fn json_lines_oracle(program: &Path, what: &str, requests: &[String]) -> Vec<Value> {
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start the {what}: {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    let input: String = requests.iter().map(|r| format!("{r}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("oracle output");
    writer.join().expect("writer").expect("write requests");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("the oracle answers JSON"))
        .collect();
    assert_eq!(
        answers.len(),
        requests.len(),
        "{what}: one answer per request"
    );
    answers
}

/// vCluster's answers to `requests` (the oracle's JSON request lines, documented in its
/// `main.go`), in order, from one process of the pinned version's translate oracle.
///
/// # Panics
/// As [`translate_oracle_at`].
pub fn translate_oracle(requests: &[Value]) -> Vec<Value> {
    translate_oracle_at(VCLUSTER_VERSIONS[0].0, requests)
}

/// [`translate_oracle`] with the translate oracle of vCluster `version` (one of
/// [`VCLUSTER_VERSIONS`]).
///
/// # Panics
/// When the oracle cannot be built or started, exits non-zero, or answers an `error` (an unknown
/// `op`, a malformed request): the request and the answer are in the panic.
pub fn translate_oracle_at(version: &str, requests: &[Value]) -> Vec<Value> {
    let lines: Vec<String> = requests.iter().map(Value::to_string).collect();
    let answers = json_lines_oracle(
        oracle_path_at("TRANSLATE_ORACLE", version),
        &format!("translate oracle {version}"),
        &lines,
    );
    for (request, answer) in requests.iter().zip(&answers) {
        assert!(answer.get("error").is_none(), "{request}: {answer}");
    }
    answers
}

/// The host name vCluster gives object `name` of virtual namespace `namespace` in vCluster
/// `vcluster` (`translate.SingleNamespaceHostName`).
///
/// # Panics
/// As [`translate_oracle`].
pub fn vcluster_host_name(name: &str, namespace: &str, vcluster: &str) -> String {
    let answer = translate_oracle(&[json!({
        "op": "hostName", "name": name, "namespace": namespace, "vcluster": vcluster
    })]);
    answer[0]["name"]
        .as_str()
        .expect("the oracle answers a name")
        .to_string()
}

/// The label selector vCluster writes on the host for `selector` (a `metav1.LabelSelector` as
/// JSON) of vCluster `vcluster` in host namespace `host_namespace`
/// (`translate.HostLabelSelector`: the rule of a `labels` patch); `None` for a null selector.
///
/// # Panics
/// As [`translate_oracle`]; also when the oracle does not know the `hostLabelSelector` request.
pub fn vcluster_host_label_selector(
    selector: &Value,
    vcluster: &str,
    host_namespace: &str,
) -> Option<Value> {
    let answer = translate_oracle(&[json!({
        "op": "hostLabelSelector", "vcluster": vcluster, "hostNamespace": host_namespace,
        "selector": selector
    })]);
    if answer[0]["selectorNull"] == json!(true) {
        return None;
    }
    Some(answer[0]["selector"].clone())
}

/// The plural Kubernetes guesses for each of `kinds`, in order, from one run of the plural
/// oracle (`tests/vcluster-go/cmd/plural-oracle`: `k8s.io/apimachinery/pkg/api/meta`
/// `UnsafeGuessKindToResource`, at the version vCluster's module pins).
///
/// # Panics
/// When the oracle cannot be built or started, exits non-zero, or answers another number of
/// lines or another kind than asked.
pub fn kubernetes_plurals(kinds: &[String]) -> Vec<String> {
    let answers = json_lines_oracle(&oracle_paths()["PLURAL_ORACLE"], "plural oracle", kinds);
    kinds
        .iter()
        .zip(answers)
        .map(|(kind, answer)| {
            assert_eq!(answer["kind"], kind.as_str(), "answers in order");
            answer["plural"]
                .as_str()
                .expect("the oracle answers a plural")
                .to_string()
        })
        .collect()
}
