//! The log events of the test process itself (the in-process operator's and runtime's
//! included), captured with a `tracing` subscriber, so that a test can show that something was
//! or was not logged.

use std::sync::{Mutex, OnceLock};

/// Warning-level log events of this process (the in-process runtime's included), each as its
/// message and fields, captured from the first call on (the first call installs the global
/// subscriber: call it before anything logs).
///
/// # Panics
/// When another global subscriber is already installed.
pub fn warnings() -> &'static Mutex<Vec<String>> {
    use tracing_subscriber::layer::SubscriberExt as _;

    struct Capture;
    struct Fields(String);
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            if let Ok(mut all) = warnings().lock() {
                all.push(fields.0);
            }
        }
    }

    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let warnings = WARNINGS.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::WARN)
            .with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("install the log capture");
    });
    warnings
}
