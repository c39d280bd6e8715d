//! [`Denial`], the policy's refusal of a plugin (`Ready=False, reason=PolicyDenied`), shared by
//! the RBAC rules' checks ([`crate::policy`]) and the container's ([`super::containers`]).

/// A refusal: the rule, where it comes from, and the policy field that refuses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Where the rule comes from, such as `spec.rbac.clusterRole.extraRules[1]`.
    pub source: String,
    /// Why, naming the policy field, such as `verb "create" in a cluster-scoped rule
    /// (policy clusterScoped.allowedVerbs: get, list, watch)`.
    pub reason: String,
    /// The rule, rendered compactly.
    pub rule: String,
}

impl Denial {
    /// The condition message: `<source> <rule> is refused by the operator policy: <reason>`.
    pub fn message(&self) -> String {
        format!(
            "{} {} is refused by the operator policy: {}",
            self.source, self.rule, self.reason
        )
    }
}
