//! A stolen or lost Lease, with two replicas of the operator binary as
//! processes (`replica-a`, `replica-b`: distinct Lease identities, and distinct `User-Agent`s,
//! which the audit log records) on one Lease of 4 s:
//!
//! - stolen: the Lease's holder is overwritten with a third identity while `replica-a` leads;
//!   `replica-a` stops within its renew deadline, nobody writes while the thief holds the
//!   Lease, and once it has expired one replica leads again and converges a change made
//!   meanwhile;
//! - lost: `replica-a` reaches the API server through a TCP proxy ([`vcp_tests::TcpProxy`])
//!   that the test pauses one way (a partition in which `replica-a` still gets answers and
//!   watch events but its requests are held; the process keeps running); a change made then
//!   reaches `replica-a`, which begins to converge it, so a request of it is in flight;
//!   `replica-a` stops before its Lease can expire, `replica-b` takes over and converges two
//!   changes, and when the proxy forwards again the held requests reach the API server: that
//!   write in flight stores nothing (a dry run, or refused), the Lease stays `replica-b`'s, and
//!   `replica-a` writes nothing more.
//!
//! In both, the operator's accepted writes in the test's namespace, in audit-log order, never
//! go back from the new leader to the old one: no two replicas write in the same interval.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::{
    Audit, AuditedWrite, Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess,
    TcpProxy, wait_for,
};

/// Lease duration of the replicas, seconds.
const LEASE: u64 = 4;
/// Where the holder must have renewed by: kube-lease-manager renews `grace` (a third of the
/// duration) before expiry, so a holder that has not renewed `LEASE - grace` after its last
/// renewal is late.
const RENEW_DEADLINE: Duration = Duration::from_secs(LEASE - LEASE / 3);
const TIMEOUT: Duration = Duration::from_secs(60);

/// The tests start operators on one control plane: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup() -> Client {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    DONE.get_or_init(|| vcp_tests::install_operator_rbac(&admin))
        .await;
    admin
}

fn replica(name: &str, lease: &str, kubeconfig: std::path::PathBuf) -> OperatorProcess {
    OperatorProcess::start(
        name,
        ControlPlane::shared().dir(),
        &OperatorOptions {
            kubeconfig,
            runtime_image: "vcp-test/runtime:lease".into(),
            abort_after_writes: None,
            stop_after_writes: None,
            leader_election: Some(("vcp-system".into(), lease.into(), LEASE)),
            concurrency: None,
        },
    )
}

/// Starts `replica-a` (with `kubeconfig_a`) and waits until it leads `lease`, then `replica-b`
/// (with `kubeconfig_b`), and checks that `replica-b`, once ready, stands by.
async fn leader_and_standby(
    lease: &str,
    kubeconfig_a: std::path::PathBuf,
    kubeconfig_b: std::path::PathBuf,
) -> (OperatorProcess, OperatorProcess) {
    let a = replica("replica-a", lease, kubeconfig_a);
    wait_leading(&a, true, TIMEOUT)
        .await
        .expect("replica-a leads");
    let b = replica("replica-b", lease, kubeconfig_b);
    wait_for(TIMEOUT, || async {
        (b.get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(leading(&b).await, Some(false), "replica-b stands by");
    (a, b)
}

fn agent(replica: &str) -> String {
    format!(
        "vcluster-plugin-operator/{}/{replica}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The replica's `vcp_leader` gauge (1 while its controller runs); `None` when it does not
/// answer.
async fn leading(op: &OperatorProcess) -> Option<bool> {
    let (_, body) = op.get("/metrics").await?;
    body.lines()
        .find_map(|l| l.strip_prefix("vcp_leader "))
        .map(|v| v.trim() == "1")
}

async fn wait_leading(op: &OperatorProcess, want: bool, timeout: Duration) -> Option<()> {
    vcp_tests::poll_for(timeout, || async {
        (leading(op).await? == want).then_some(())
    })
    .await
}

/// The operator's writes in namespace `ns` (Leases and dry runs left out), in order.
fn writes(ns: &str) -> Vec<AuditedWrite> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(ns)
        .without_dry_runs()
        .attempts()
}

/// The replicas whose writes follow one another in `writes`, each run of writes by one
/// replica counted once (`[a, a, b, b]` is `[a, b]`).
fn writers_in_turn(writes: &[AuditedWrite]) -> Vec<String> {
    let mut turns: Vec<String> = Vec::new();
    for w in writes {
        if turns.last() != Some(&w.user_agent) {
            turns.push(w.user_agent.clone());
        }
    }
    turns
}

async fn prepare(admin: &Client, ns: &str) {
    vcp_tests::create_namespace(admin, ns).await;
    vcp_tests::apply_yaml(admin, &vcp_tests::vcluster_workload(ns), Some(ns))
        .await
        .expect("create the vCluster's workload as its chart renders it");
    vcp_tests::create_plugin(
        admin,
        ns,
        "v2",
        json!({
            "vcluster": { "name": "my-vcluster" },
            "version": "v2",
            "image": "example.com/plugin:1",
        }),
    )
    .await;
}

/// Waits until the audit log holds the last writes of the leader's install of the plugin in
/// `ns`: its status patch and its Event, which follow the StatefulSet's apply (the
/// reconcile's order: finalizer, workload, status, Event). The leader is then idle, so a write
/// after this moment is a decision made after it, not one still in flight.
async fn idle_after_install(cp: &ControlPlane, ns: &str) {
    wait_for(TIMEOUT, || async {
        vcp_tests::audit_caught_up(cp, Cluster::Host).await;
        let all = writes(ns);
        let status = all
            .iter()
            .any(|w| w.verb == "patch" && w.uri.contains("/status"));
        let event = all
            .iter()
            .any(|w| w.verb == "create" && w.uri.contains("/events"));
        (status && event).then_some(())
    })
    .await;
}

/// Sets the plugin's image to `example.com/plugin:<tag>`.
async fn change(admin: &Client, ns: &str, tag: u32) {
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(
            "v2",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "image": format!("example.com/plugin:{tag}") } })),
        )
        .await
        .expect("change the plugin's image");
}

/// Waits until the StatefulSet's v2 init container has `example.com/plugin:<tag>`.
async fn converged(admin: &Client, ns: &str, tag: u32, timeout: Duration) {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns);
    let want = format!("example.com/plugin:{tag}");
    wait_for(timeout, || {
        let sts = sts.clone();
        let want = want.clone();
        async move {
            let live = sts.get("my-vcluster").await.ok()?;
            let image = live
                .spec?
                .template
                .spec?
                .init_containers?
                .into_iter()
                .find(|c| c.name == "v2")?
                .image?;
            (image == want).then_some(())
        }
    })
    .await;
}

async fn holder(admin: &Client, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(admin.clone(), "vcp-system")
        .get_opt(lease)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_lease_stops_the_old_leader_and_one_replica_leads_again() {
    let _serial = SERIAL.lock().await;
    let admin = setup().await;
    let cp = ControlPlane::shared();
    let (ns, lease) = ("lease-stolen", "lease-stolen");
    let kubeconfig = cp.kubeconfig(Cluster::Host, Identity::Operator);
    let (a, b) = leader_and_standby(lease, kubeconfig.clone(), kubeconfig).await;
    prepare(&admin, ns).await;
    converged(&admin, ns, 1, TIMEOUT).await;
    idle_after_install(cp, ns).await;

    // The theft: a third identity takes the Lease, freshly renewed, for LEASE seconds.
    let stolen_at = SystemTime::now();
    let theft = Instant::now();
    Api::<Lease>::namespaced(admin.clone(), "vcp-system")
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "holderIdentity": "thief",
                "acquireTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
                "leaseDurationSeconds": LEASE,
            }})),
        )
        .await
        .expect("steal the Lease");
    wait_leading(&a, false, TIMEOUT)
        .await
        .expect("replica-a stops leading");
    let stopped = theft.elapsed();
    let before_change = writes(ns).len();
    change(&admin, ns, 2).await;
    converged(&admin, ns, 2, TIMEOUT).await;
    let resumed = theft.elapsed();
    let new_leader = holder(&admin, lease).await.expect("a holder");

    vcp_tests::audit_caught_up(cp, Cluster::Host).await;
    let all = writes(ns);
    let after_theft: Vec<&AuditedWrite> =
        all.iter().filter(|w| w.received_at >= stolen_at).collect();
    let first_after = after_theft
        .first()
        .map(|w| w.received_at.duration_since(stolen_at).unwrap_or_default());
    println!(
        "stolen Lease: replica-a stopped {:.2} s after the theft (renew deadline {:?}); change \
         converged {:.1} s after it by {new_leader}; {} writes before the change, {} after the \
         theft, the first {first_after:?} after it; writers in turn {:?}",
        stopped.as_secs_f64(),
        RENEW_DEADLINE,
        resumed.as_secs_f64(),
        before_change,
        after_theft.len(),
        writers_in_turn(&all)
    );
    assert!(
        stopped <= RENEW_DEADLINE,
        "replica-a stopped {stopped:?} after the theft, later than its renew deadline"
    );
    assert!(
        ["replica-a", "replica-b"].contains(&new_leader.as_str()),
        "a replica leads again: {new_leader}"
    );
    assert!(
        first_after.is_some_and(|t| t >= Duration::from_secs(LEASE)),
        "nobody writes while the thief's Lease is valid: first write {first_after:?} after \
         the theft: {:?}",
        after_theft
            .iter()
            .map(|w| (
                &w.user_agent,
                &w.verb,
                &w.uri,
                w.received_at.duration_since(stolen_at)
            ))
            .collect::<Vec<_>>()
    );
    assert!(
        after_theft
            .iter()
            .all(|w| w.user_agent == agent(&new_leader)),
        "only the new leader writes after the theft: {:?}",
        after_theft
            .iter()
            .map(|w| (&w.user_agent, &w.uri))
            .collect::<Vec<_>>()
    );
    let turns = writers_in_turn(&all);
    assert!(turns.len() <= 2, "writers in turn {turns:?}");
    assert_eq!(turns.first(), Some(&agent("replica-a")));
    tokio::task::spawn_blocking(move || {
        a.terminate(TIMEOUT);
        b.terminate(TIMEOUT);
    })
    .await
    .expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires() {
    let _serial = SERIAL.lock().await;
    let admin = setup().await;
    let cp = ControlPlane::shared();
    let (ns, lease) = ("lease-cut", "lease-cut");
    let direct = cp.kubeconfig(Cluster::Host, Identity::Operator);
    let proxy = TcpProxy::start(vcp_tests::kubeconfig_server(&direct).expect("server"))
        .await
        .expect("start the proxy");
    let through_proxy = proxy
        .kubeconfig(&direct, cp.dir().join("kubeconfig-host-operator-proxied"))
        .expect("proxied kubeconfig");
    let (a, b) = leader_and_standby(lease, through_proxy, direct).await;
    prepare(&admin, ns).await;
    converged(&admin, ns, 1, TIMEOUT).await;
    vcp_tests::audit_caught_up(cp, Cluster::Host).await;
    let a_writes = writes(ns).len();
    assert!(a_writes > 0, "replica-a installed the plugin");

    // The partition, one way: replica-a's requests are held at the proxy (its Lease renewals
    // and reads too), while the API server's answers and watch events still reach it. The
    // process keeps running. A change made now reaches replica-a through its watch, so it
    // begins to converge it: the request it sends for that stays in flight, held. (It goes out
    // on the controller's idle connection. Before the Lease had a client of its own, a Lease
    // read held in the partition could be on the one idle connection, the request then needed
    // a new one whose TLS handshake the partition held, and no HTTP request was in flight: 2 runs in 11
    // under load, and the fresh-clone CI of e34619c.)
    let cut = Instant::now();
    proxy.pause_upstream();
    // (After the pause: a request already past the proxy is answered before this.)
    let cut_at = SystemTime::now();
    change(&admin, ns, 2).await;
    let stopped = wait_leading(&a, false, Duration::from_secs(3 * LEASE)).await;
    let stopped_after = cut.elapsed();
    assert!(
        stopped.is_some(),
        "replica-a, cut off, still runs its controller {stopped_after:?} after the cut (its \
         Lease expired after at most {LEASE} s)"
    );
    wait_leading(&b, true, TIMEOUT)
        .await
        .expect("replica-b takes over");
    let took_over = cut.elapsed();
    converged(&admin, ns, 2, TIMEOUT).await;
    change(&admin, ns, 3).await;
    converged(&admin, ns, 3, TIMEOUT).await;

    // The partition heals with replica-a's requests still in flight: nothing is dropped, the
    // held bytes reach the API server now, after replica-b's writes.
    let healed_at = SystemTime::now();
    let healed = Instant::now();
    proxy.resume();
    // replica-a has read the Lease again (its log says whose it is) and stays a standby.
    let log = a.log.clone();
    wait_for(TIMEOUT, || {
        let log = log.clone();
        async move {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .any(|l| l.contains("the Lease is readable again") && l.contains("replica-b"))
                .then_some(())
        }
    })
    .await;
    assert_eq!(leading(&a).await, Some(false), "replica-a stays a standby");
    change(&admin, ns, 4).await;
    converged(&admin, ns, 4, TIMEOUT).await;
    vcp_tests::audit_caught_up(cp, Cluster::Host).await;

    // What replica-a had in flight: every request of its identity and agent that the API
    // server received after the cut (Leases and dry runs included).
    let late: Vec<AuditedWrite> = Audit::writes()
        .by(Identity::Operator)
        .since(cut_at)
        .attempts()
        .into_iter()
        .filter(|w| w.user_agent == agent("replica-a"))
        .collect();
    let show = |ws: &[AuditedWrite]| -> Vec<String> {
        ws.iter()
            .map(|w| format!("{} {} -> {}", w.verb, w.uri, w.code))
            .collect()
    };
    let all = writes(ns);
    let accepted: Vec<AuditedWrite> = all
        .iter()
        .filter(|w| (200..300).contains(&w.code))
        .cloned()
        .collect();
    let after_cut: Vec<&AuditedWrite> = accepted
        .iter()
        .filter(|w| w.received_at >= cut_at)
        .collect();
    let holder_now = holder(&admin, lease).await;
    println!(
        "cut-off leader: replica-a stopped {:.2} s after the cut (Lease {LEASE} s), replica-b \
         led {:.2} s after it; {a_writes} writes by replica-a before, {} accepted after the cut \
         (all by replica-b expected); replica-a re-read the Lease {:.2} s after the heal; its \
         requests received after the cut: {:?}; Lease holder {holder_now:?}; accepted writers \
         in turn {:?}",
        stopped_after.as_secs_f64(),
        took_over.as_secs_f64(),
        after_cut.len(),
        healed.elapsed().as_secs_f64(),
        show(&late),
        writers_in_turn(&accepted)
    );
    assert!(
        stopped_after < Duration::from_secs(LEASE),
        "replica-a stopped {stopped_after:?} after the cut: not before its Lease could expire"
    );
    assert!(!after_cut.is_empty(), "replica-b converged the changes");
    assert!(
        after_cut.iter().all(|w| w.user_agent == agent("replica-b")),
        "only replica-b's writes are accepted after the cut: {:?}",
        after_cut
            .iter()
            .map(|w| (&w.user_agent, &w.uri))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        writers_in_turn(&accepted),
        [agent("replica-a"), agent("replica-b")],
        "no two replicas write in the same interval"
    );
    // The request in flight: replica-a began converging change 2 during the partition, and
    // the API server got its first request for it only when the partition healed, after
    // replica-b's writes. That request is a read (a GET of the workload, or the namespace's
    // LimitRanges, ResourceQuotas or the nodes, which the resources judge lists when a plugin's
    // part changes) or the workload's apply, as far as the reconcile got before its Lease ran
    // out.
    let in_flight: Vec<AuditedWrite> = late
        .iter()
        .filter(|w| w.uri.contains(&format!("/namespaces/{ns}/")))
        .cloned()
        .collect();
    let late_reads: Vec<String> =
        vcp_tests::audited_requests(cp, Cluster::Host, Identity::Operator.user())
            .expect("the audit log")
            .into_iter()
            .filter(|r| {
                r.received_at >= cut_at
                    && r.user_agent == agent("replica-a")
                    && !r.uri.contains("/leases/")
            })
            .filter(|r| {
                r.uri.contains(&format!("/namespaces/{ns}/")) || r.uri.starts_with("/api/v1/nodes")
            })
            .map(|r| format!("{} {}", r.verb, r.uri))
            .collect();
    assert!(
        !in_flight.is_empty() || !late_reads.is_empty(),
        "replica-a had a request for the plugin's change in flight when the partition healed: \
         writes {:?}, reads {late_reads:?}",
        show(&late)
    );
    assert!(
        late.iter().all(|w| w.received_at >= healed_at),
        "nothing of replica-a's got through the partition before it healed: {:?}",
        show(&late)
    );
    // The stale leader's writes are refused or harmless: none of them stored anything in the
    // namespace (a dry run stores nothing; anything else must have been refused), ...
    let stored: Vec<AuditedWrite> = in_flight
        .iter()
        .filter(|w| (200..300).contains(&w.code) && !w.uri.contains("dryRun="))
        .cloned()
        .collect();
    assert!(
        stored.is_empty(),
        "a stale leader's write was accepted after the heal: {:?}",
        show(&stored)
    );
    // ... its Lease requests did not take the Lease back (seen: its renewal in flight, a
    // strategic-merge patch of `renewTime` alone from kube-lease-manager, is accepted after the
    // heal and renews replica-b's Lease, holder unchanged), and the workload holds the new
    // leader's last change (checked by `converged` above, after the heal).
    assert_eq!(
        holder_now.as_deref(),
        Some("replica-b"),
        "the Lease stays replica-b's"
    );
    tokio::task::spawn_blocking(move || {
        a.terminate(TIMEOUT);
        b.terminate(TIMEOUT);
    })
    .await
    .expect("stop");
}

/// SIGTERM while the operator cannot reach the API server (its caches never fill): it still
/// stops, within its shutdown deadline, instead of waiting forever for caches a stopping
/// controller no longer fills (seen: a SIGTERM in the first ~50 ms after start was never
/// answered; kube-runtime holds the applier "until store is ready", and the graceful shutdown
/// waits for the applier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_the_api_server_is_unreachable_stops_the_operator() {
    let _serial = SERIAL.lock().await;
    setup().await;
    let cp = ControlPlane::shared();
    let direct = cp.kubeconfig(Cluster::Host, Identity::Operator);
    let proxy = TcpProxy::start(vcp_tests::kubeconfig_server(&direct).expect("server"))
        .await
        .expect("start the proxy");
    proxy.pause();
    let through_proxy = proxy
        .kubeconfig(
            &direct,
            cp.dir().join("kubeconfig-host-operator-unreachable"),
        )
        .expect("proxied kubeconfig");
    let op = OperatorProcess::start(
        "unreachable",
        cp.dir(),
        &OperatorOptions {
            kubeconfig: through_proxy,
            runtime_image: "vcp-test/runtime:lease".into(),
            abort_after_writes: None,
            stop_after_writes: None,
            leader_election: None,
            concurrency: None,
        },
    );
    // Up (its HTTP server answers) but not ready: the caches cannot fill.
    wait_for(TIMEOUT, || async { op.get("/healthz").await.map(|_| ()) }).await;
    assert_eq!(
        op.get("/readyz").await.map(|(code, _)| code),
        Some(503),
        "not ready while the API server is unreachable"
    );
    let log = op.log.clone();
    op.signal("TERM");
    let sent = Instant::now();
    let (status, took) = tokio::task::spawn_blocking(move || {
        let mut op = op;
        let status = op.wait_exit(Duration::from_secs(30));
        (status, sent.elapsed())
    })
    .await
    .expect("wait");
    println!(
        "SIGTERM with the API server unreachable: exited {status:?} {:.1} s after it",
        took.as_secs_f64()
    );
    assert!(
        status.is_some(),
        "the operator still runs 30 s after SIGTERM; log {}",
        log.display()
    );
    assert!(
        took < Duration::from_secs(15),
        "stopped only after {took:?}"
    );
}
