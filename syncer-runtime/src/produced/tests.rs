//! Unit tests of [`super`]: the names, the claims, the index and the copies.

use super::index::{Declared, Index};
use super::names::{Claimant, claim, string_at};
use super::*;
use crate::translate::NamespacedTranslator;
use serde_json::json;
use std::collections::HashMap;

#[test]
fn the_source_is_named_as_kubectl_names_a_resource_of_a_group() {
    assert_eq!(
        produced_for("cert-manager.io/v1", "Certificate", "web"),
        "Certificate.cert-manager.io/web"
    );
    assert_eq!(produced_for("v1", "ConfigMap", "a"), "ConfigMap/a");
}

/// The index follows what a synced object declares: a changed name leaves no stale entry,
/// two objects declaring one name are both found, a forgotten object is gone everywhere.
fn claimant(namespace: &str, name: &str, virtual_name: &str, holds_copy: bool) -> Claimant {
    Claimant {
        kind: "Certificate".into(),
        key: ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        },
        virtual_name: virtual_name.into(),
        holds_copy,
    }
}

#[test]
fn a_host_name_with_one_reading_only_is_not_ambiguous() {
    assert_eq!(ambiguous_host_name("web-tls", "team", "vc"), None);
    assert_eq!(ambiguous_host_name("a-xb", "xa-b", "x"), None);
    // the fourth attacker's pair, and the other ways to a third separator
    for (name, namespace, vcluster) in [
        ("web-tls", "a-x-team", "vc"),
        ("web-tls-x-a", "team", "vc"),
        ("tls", "q", "a-x-b"),
        ("a-x", "b", "vc"),
        ("a", "x-b", "vc"),
    ] {
        let why = ambiguous_host_name(name, namespace, vcluster).expect(name);
        assert!(why.contains("3 times"), "{why}");
    }
}

/// The name at `namePath` is any string a virtual user writes: one with multi-byte
/// characters is judged like any other (before, slicing it inside a character panicked,
/// and the panic ended the task of the synced type: no object of the type synced any more).
#[test]
fn a_name_with_multi_byte_characters_is_judged_without_panicking() {
    assert_eq!(ambiguous_host_name("é-tls", "team", "vc"), None);
    assert_eq!(ambiguous_host_name("wéb", "tëam", "vç"), None);
    let why = ambiguous_host_name("é-x-ü", "team", "vc").expect("three separators");
    assert!(why.contains("3 times"), "{why}");
}

/// Against brute force: every DNS label of up to 4 characters over `a`, `x` and `-` as
/// name, namespace and vCluster: a triple [`ambiguous_host_name`] lets through spells a
/// string no other triple spells (and many it refuses share theirs with another).
#[test]
fn the_ambiguity_rule_matches_an_exhaustive_search() {
    let mut labels = Vec::new();
    for len in 1..=4u32 {
        for n in 0..3usize.pow(len) {
            let label: String = (0..len)
                .map(|i| ['a', 'x', '-'][n / 3usize.pow(i) % 3])
                .collect();
            if !label.starts_with('-') && !label.ends_with('-') {
                labels.push(label);
            }
        }
    }
    let mut spelled: HashMap<String, Vec<(usize, usize, usize)>> = HashMap::new();
    for (a, n) in labels.iter().enumerate() {
        for (b, ns) in labels.iter().enumerate() {
            for (c, vc) in labels.iter().enumerate() {
                spelled
                    .entry(format!("{n}-x-{ns}-x-{vc}"))
                    .or_default()
                    .push((a, b, c));
            }
        }
    }
    let (mut unique, mut shared) = (0, 0);
    for triples in spelled.values() {
        for &(a, b, c) in triples {
            let refused = ambiguous_host_name(&labels[a], &labels[b], &labels[c]).is_some();
            if refused {
                shared += usize::from(triples.len() > 1);
            } else {
                unique += 1;
                assert_eq!(
                    triples.len(),
                    1,
                    "{:?}",
                    (&labels[a], &labels[b], &labels[c])
                );
            }
        }
    }
    // both kinds occur, so the search tested something
    assert!(unique > 1000 && shared > 1000, "{unique} {shared}");
}

#[test]
fn an_ambiguous_host_name_is_brought_back_nowhere() {
    // the attack: `web-tls` in `a-x-team` and `web-tls-x-a` in `team` have one host name
    let host = "web-tls-x-a-x-team-x-vc";
    let translator = NamespacedTranslator::new("vc", "host-ns", "v1", "Secret");
    assert_eq!(translator.host_name("web-tls", "a-x-team"), host);
    assert_eq!(translator.host_name("web-tls-x-a", "team"), host);
    let victim = |holds| claimant("a-x-team", "web", "web-tls", holds);
    let attacker = |holds| claimant("team", "grab", "web-tls-x-a", holds);
    // the second round's attack: the attacker forged the marks of a held copy on an object
    // of their own namespace; holding a copy wins nothing, for either side
    for (attacker_holds, victim_holds) in [(true, true), (true, false), (false, true)] {
        let refused = claim(
            &attacker(attacker_holds),
            &[victim(victim_holds)],
            host,
            "Certificate",
            "Secret",
        )
        .unwrap_err();
        assert!(refused.contains("a-x-team/web-tls"), "{refused}");
        assert!(
            claim(
                &victim(victim_holds),
                &[attacker(attacker_holds)],
                host,
                "Certificate",
                "Secret"
            )
            .is_err()
        );
    }
    let refused = claim(
        &attacker(false),
        &[victim(true)],
        host,
        "Certificate",
        "Secret",
    )
    .unwrap_err();
    assert!(
        refused.contains("was brought back as a-x-team/web-tls"),
        "{refused}"
    );
    // neither holds one: both are refused until one is left
    assert!(
        claim(
            &victim(false),
            &[attacker(false)],
            host,
            "Certificate",
            "Secret"
        )
        .is_err()
    );
    assert!(
        claim(
            &attacker(false),
            &[victim(false)],
            host,
            "Certificate",
            "Secret"
        )
        .is_err()
    );
    assert_eq!(
        claim(&victim(false), &[], host, "Certificate", "Secret"),
        Ok(())
    );
    // two synced objects of one namespace naming the same virtual name are one place
    let twin = claimant("a-x-team", "web-2", "web-tls", false);
    assert_eq!(
        claim(&victim(false), &[twin], host, "Certificate", "Secret"),
        Ok(())
    );
}

/// The third attacker's H2: one host name declared through two synced types (two entries):
/// each entry sees the other's places as rivals, its own not (its index has them); what a
/// place no longer declares is forgotten.
#[test]
fn claims_are_shared_across_synced_types() {
    let claims = Claims::default();
    let key = |ns: &str, name: &str| ObjectKey {
        namespace: ns.into(),
        name: name.into(),
    };
    let host = "web-tls-x-a-x-team-x-vc";
    let certs = ("Certificate.cert-manager.io/spec.secretName", "Certificate");
    let widgets = ("Widget.e2e.vcp.test/spec.secretName", "Widget");
    let victim: Declared = ("web-tls".into(), host.into());
    let attacker: Declared = ("web-tls-x-a".into(), host.into());
    claims.declare(
        "v1/Secret",
        certs,
        &key("a-x-team", "web"),
        None,
        Some(&victim),
    );
    claims.declare(
        "v1/Secret",
        widgets,
        &key("team", "grab"),
        None,
        Some(&attacker),
    );
    assert_eq!(
        claims.others("v1/Secret", host, widgets.0),
        [(
            "Certificate".to_string(),
            key("a-x-team", "web"),
            "web-tls".to_string()
        )]
    );
    assert_eq!(
        claims.others("v1/Secret", host, certs.0),
        [(
            "Widget".to_string(),
            key("team", "grab"),
            "web-tls-x-a".to_string()
        )]
    );
    // another produced kind of the same host name is another object
    assert!(claims.others("v1/ConfigMap", host, widgets.0).is_empty());
    // the claim of the attacker's Widget is refused, naming the victim's Certificate
    let ours = Claimant {
        key: key("team", "grab"),
        virtual_name: "web-tls-x-a".into(),
        holds_copy: false,
        kind: "Widget".into(),
    };
    let others: Vec<Claimant> = claims
        .others("v1/Secret", host, widgets.0)
        .into_iter()
        .map(|(kind, key, virtual_name)| Claimant {
            key,
            virtual_name,
            holds_copy: false,
            kind,
        })
        .collect();
    let refused = claim(&ours, &others, host, "Widget", "Secret").unwrap_err();
    assert!(
        refused.contains("a-x-team/web-tls (for Certificate a-x-team/web)"),
        "{refused}"
    );
    // the victim's place goes: the attacker's is the only one left
    claims.declare(
        "v1/Secret",
        certs,
        &key("a-x-team", "web"),
        Some(&victim),
        None,
    );
    assert!(claims.others("v1/Secret", host, widgets.0).is_empty());
    claims.declare(
        "v1/Secret",
        widgets,
        &key("team", "grab"),
        Some(&attacker),
        None,
    );
    assert!(claims.by_host_name.lock().unwrap().is_empty());
}

/// Nothing comes back until every entry the runtime runs has listed; an entry whose kind
/// is not served is not waited for.
#[test]
fn nothing_comes_back_before_every_entry_has_listed() {
    let claims = Claims::default();
    let certs = Claims::entry("cert-manager.io/v1", "Certificate", "spec.secretName");
    let widgets = Claims::entry("e2e.vcp.test/v1", "Widget", "spec.secretName");
    assert_eq!(certs, "Certificate.cert-manager.io/spec.secretName");
    claims.expect(certs.clone());
    claims.expect(widgets.clone());
    claims.listed(&widgets);
    assert_eq!(claims.waiting(), std::slice::from_ref(&certs));
    claims.unexpect(&certs);
    assert!(claims.waiting().is_empty());
    claims.expect(certs.clone());
    claims.listed(&certs);
    claims.expect(certs);
    assert!(claims.waiting().is_empty(), "a listed entry stays listed");
}

#[test]
fn the_index_follows_declared_names_and_copies() {
    let key = |name: &str| ObjectKey {
        namespace: "a".into(),
        name: name.into(),
    };
    let mut index = Index::default();
    let none = BTreeSet::new();
    assert_eq!(
        index.declare(&key("web"), Some(("tls".into(), "tls-x-a-x-vc".into()))),
        none
    );
    // a rival that comes is reported, so that the first declarer is reconciled too
    assert_eq!(
        index.declare(&key("api"), Some(("tls".into(), "tls-x-a-x-vc".into()))),
        BTreeSet::from([key("web")])
    );
    assert_eq!(index.by_host_name["tls-x-a-x-vc"].len(), 2);
    // and one that goes: `web` leaves the name, `api` is told
    assert_eq!(
        index.declare(
            &key("web"),
            Some(("web-tls".into(), "web-tls-x-a-x-vc".into())),
        ),
        BTreeSet::from([key("api")])
    );
    assert_eq!(
        index.by_host_name["tls-x-a-x-vc"],
        BTreeSet::from([key("api")])
    );
    assert_eq!(
        index.by_virtual_name[&("a".to_string(), "web-tls".to_string())],
        BTreeSet::from([key("web")])
    );
    index.declare(&key("api"), None);
    index.declare(&key("web"), None);
    assert!(index.declared.is_empty() && index.by_host_name.is_empty());
    assert!(index.by_virtual_name.is_empty());
    index.copy(&key("web"), "tls", false);
    index.copy(&key("web"), "web-tls", false);
    index.copy(&key("web"), "tls", true);
    assert_eq!(
        index.copies[&key("web")],
        BTreeSet::from(["web-tls".to_string()])
    );
    index.copy(&key("web"), "web-tls", true);
    assert!(index.copies.is_empty());
}

#[test]
fn a_dotted_path_reads_a_non_empty_string() {
    let obj = json!({"spec": {"secretName": "web-tls", "empty": "", "n": 1, "o": {}}});
    assert_eq!(string_at(&obj, "spec.secretName"), Some("web-tls"));
    for path in [
        "spec.empty",
        "spec.n",
        "spec.o",
        "spec.missing",
        "spec",
        "x.y",
    ] {
        assert_eq!(string_at(&obj, path), None, "{path}");
    }
}

/// The copy of a Secret cert-manager issued on the host for the host copy of Certificate
/// `team-a/web` (its `secretName` `web-tls` translated to `web-tls-x-team-a-x-vc`).
#[test]
fn a_copy_carries_the_content_and_the_marks_of_its_source() {
    let host: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-tls-x-team-a-x-vc", "namespace": "vc-ns", "uid": "h",
                     "resourceVersion": "5",
                     "labels": {"controller.cert-manager.io/fao": "true",
                                "vcluster.loft.sh/managed-by": "vc"},
                     "annotations": {"cert-manager.io/certificate-name": "web-x-team-a-x-vc",
                                     "vcluster.loft.sh/object-name": "x",
                                     "vcp.dev/produced-for": "Certificate.cert-manager.io/forged"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "Y3J0", "tls.key": "a2V5"}
    }))
    .unwrap();
    let copy = produced_copy(
        &host,
        ("team-a", "web-tls"),
        "Certificate.cert-manager.io/web",
        "spec.secretName",
        None,
    );
    let expected: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-tls", "namespace": "team-a",
                     "labels": {"controller.cert-manager.io/fao": "true"},
                     "annotations": {
                         "cert-manager.io/certificate-name": "web-x-team-a-x-vc",
                         "vcp.dev/produced-for": "Certificate.cert-manager.io/web",
                         "vcp.dev/produced-path": "spec.secretName",
                         "vcluster.loft.sh/object-host-name": "web-tls-x-team-a-x-vc",
                         "vcluster.loft.sh/object-host-namespace": "vc-ns"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "Y3J0", "tls.key": "a2V5"}
    }))
    .unwrap();
    assert_eq!(copy, expected);

    // an update keeps the virtual object's own metadata
    let mut base = copy.clone();
    base.metadata.uid = Some("v".into());
    base.metadata.resource_version = Some("9".into());
    let mut renewed = host.clone();
    renewed.data["data"]["tls.crt"] = json!("bmV3");
    let updated = produced_copy(
        &renewed,
        ("team-a", "web-tls"),
        "Certificate.cert-manager.io/web",
        "spec.secretName",
        Some(&base),
    );
    assert_eq!(updated.metadata.uid.as_deref(), Some("v"));
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("9"));
    assert_eq!(updated.data["data"]["tls.crt"], json!("bmV3"));
}
