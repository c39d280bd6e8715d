//! How the pod policy words a refusal: the field, the value it holds, and why.

use crate::policy::Denial;

/// The refusal of `value` at `source` (a field of the hooked pod), for `reason`.
pub(super) fn denial(
    source: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> Denial {
    Denial {
        source: source.into(),
        reason: reason.into(),
        rule: format!("= {}", value.into()),
    }
}

/// The [`denial`] of `value` at `source`, which is not among `allowed`: the reason is `what`,
/// then the Pod Security `control` (level and name) with the list it allows.
pub(super) fn not_listed(
    source: String,
    value: String,
    what: &str,
    (control, allowed): (&str, &[&str]),
) -> Denial {
    let allowed = allowed.join(", ");
    denial(
        source,
        value,
        format!("{what} (Pod Security {control}: {allowed})"),
    )
}
