//! Refusals shared by the pod's paths down ([`super::down`]) and its ephemeral containers
//! ([`super::ephemeral`]): the policy's event reason, and which super-apiserver answers are refusals.

/// Reason of the event on a tenant pod the pod policy refuses.
pub const REASON_POLICY_VIOLATION: &str = "PodPolicyViolation";

/// Whether the super apiserver refused a request for what it asked (invalid, forbidden by admission, not
/// served), as opposed to failing in a way worth retrying.
pub fn is_refusal(error: &crate::Error) -> bool {
    [400, 403, 405, 422].into_iter().any(|code| error.is_status(code))
        || (error.is_status(404)
            && error
                .status_message()
                .is_some_and(|m| m.contains("could not find the requested resource")))
}
