//! The vcluster-sdk tutorial's plugin ("crd-sync": a `Car` syncer and a pod hook), written
//! with this crate's plugin-author API ([`vcp_syncer_runtime::sdk`]).
//!
//! Run it beside a vCluster (or against the local control plane of `scripts/control-plane`):
//!
//! ```text
//! HOST_KUBECONFIG=… VIRTUAL_KUBECONFIG=… POD_NAMESPACE=my-vcluster VCLUSTER_NAME=my-vcluster \
//!   cargo run -p vcp-syncer-runtime --example car_syncer
//! ```
//!
//! What it does, as the tutorial's Go plugin does:
//! - every virtual `Car` (`example.loft.sh/v1`) gets a host copy in the vCluster's namespace,
//!   named and labelled as vCluster's own syncer would; spec and metadata changes follow; a
//!   deleted virtual Car deletes its host copy;
//! - every host pod the vCluster made gets the label `created-by-plugin=pod-hook`.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use vcp_crds::Car;
use vcp_syncer_runtime::hooks::HookError;
use vcp_syncer_runtime::sdk::{
    ClientHook, HookPoint, NamespacedTranslator, Plugin, RegisterContext, SyncContext, Syncer,
};

/// The tutorial's `carSyncer`: a [`NamespacedTranslator`] for `Car` and the three sync methods.
pub struct CarSyncer {
    translator: NamespacedTranslator,
}

impl CarSyncer {
    /// `NewCarSyncer(ctx)`.
    pub fn new(ctx: &RegisterContext) -> Self {
        Self {
            translator: ctx.translator::<Car>(),
        }
    }

    /// The host copy of a new virtual Car: translated metadata, the same spec, no status.
    fn translate(&self, virtual_car: &Car) -> Car {
        Car {
            metadata: self.translator.translate_metadata(&virtual_car.metadata),
            spec: virtual_car.spec.clone(),
            status: None,
        }
    }

    /// The tutorial's `translateUpdate`: the changed host Car, or `None` when nothing changed.
    fn translate_update(&self, host_car: &Car, virtual_car: &Car) -> Option<Car> {
        let mut updated: Option<Car> = None;
        if host_car.spec != virtual_car.spec {
            updated.get_or_insert_with(|| host_car.clone()).spec = virtual_car.spec.clone();
        }
        if let Some(update) = self
            .translator
            .translate_metadata_update(&virtual_car.metadata, &host_car.metadata)
        {
            let car = updated.get_or_insert_with(|| host_car.clone());
            car.metadata.labels = Some(update.labels);
            car.metadata.annotations = Some(update.annotations);
        }
        updated
    }
}

impl Syncer for CarSyncer {
    type Object = Car;

    fn dynamic_type(&self) {}

    fn translator(&self) -> &NamespacedTranslator {
        &self.translator
    }

    async fn sync_to_host(
        &self,
        ctx: &SyncContext<Car>,
        virtual_car: &Car,
    ) -> Result<(), vcp_syncer_runtime::Error> {
        ctx.sync_to_host_create(virtual_car, self.translate(virtual_car))
            .await
    }

    async fn sync(
        &self,
        ctx: &SyncContext<Car>,
        host_car: &Car,
        virtual_car: &Car,
    ) -> Result<(), vcp_syncer_runtime::Error> {
        ctx.sync_to_host_update(host_car, self.translate_update(host_car, virtual_car))
            .await
    }
}

/// The tutorial's `podHook`: labels host pods `created-by-plugin=pod-hook` on create and
/// update.
pub struct PodHook;

impl PodHook {
    fn label(obj: Value) -> Result<Value, HookError> {
        let custom = |e: serde_json::Error| HookError::Custom {
            hook: "pod-hook".into(),
            message: e.to_string(),
        };
        let mut pod: Pod = serde_json::from_value(obj).map_err(custom)?;
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("created-by-plugin".into(), "pod-hook".into());
        serde_json::to_value(pod).map_err(custom)
    }
}

impl ClientHook for PodHook {
    fn name(&self) -> &str {
        "pod-hook"
    }
    fn api_version(&self) -> &str {
        "v1"
    }
    fn kind(&self) -> &str {
        "Pod"
    }
    fn handles(&self, point: HookPoint) -> bool {
        matches!(point, HookPoint::CreatePhysical | HookPoint::UpdatePhysical)
    }
    fn mutate_create_physical(&self, obj: Value) -> Result<Value, HookError> {
        Self::label(obj)
    }
    fn mutate_update_physical(&self, obj: Value) -> Result<Value, HookError> {
        Self::label(obj)
    }
}

/// `plugin.MustInit()`, `plugin.MustRegister(...)`, `plugin.MustStart()`. (Left out when the
/// end-to-end test includes this file to run the same syncer and hook in-process.)
#[cfg(not(test))]
#[tokio::main]
async fn main() -> Result<(), vcp_syncer_runtime::Error> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut plugin = Plugin::init().await?;
    let car_syncer = CarSyncer::new(plugin.context());
    plugin.register(car_syncer);
    plugin.register_hook(PodHook);
    plugin.start().await
}
