//! Unit tests of [`super`]: which synced types the runtime syncs.

use super::*;
use vcp_crds::SyncedType;

fn synced(api_version: &str, kind: &str) -> SyncedType {
    SyncedType {
        api_version: api_version.into(),
        kind: kind.into(),
        ..SyncedType::default()
    }
}

/// The second attacker's plugin (`syncedTypes: [v1 Pod]`) syncs no pod beside a vCluster;
/// the standalone pod syncer keeps its own `Pod` entry.
#[test]
fn kinds_kubernetes_acts_on_are_not_synced() {
    let declared = [
        synced("example.loft.sh/v1", "Car"),
        synced("v1", "Pod"),
        synced("v1", "ConfigMap"),
        synced("apps/v1", "Deployment"),
    ];
    for pod_sync in [PodSync::Hooks, PodSync::Mutate] {
        let (kept, refused) = syncable_types(&declared, pod_sync);
        assert_eq!(kept, [declared[0].clone(), declared[2].clone()]);
        assert_eq!(refused.len(), 2);
        assert!(
            refused[0].starts_with("spec.syncedTypes[1] (v1 Pod)"),
            "{}",
            refused[0]
        );
        assert!(
            refused[1].starts_with("spec.syncedTypes[3] (apps/v1 Deployment)"),
            "{}",
            refused[1]
        );
    }
    let (kept, refused) = syncable_types(&declared, PodSync::Full);
    assert_eq!(kept, declared[..3]);
    assert_eq!(refused.len(), 1);
}
