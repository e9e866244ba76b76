//! Refusals shared by the pod's paths down ([`super::create`], [`super::update`]) and its ephemeral
//! containers ([`super::ephemeral`]): the policy's event reason, which super-apiserver answers are refusals,
//! and what the tenant is told when the super cluster refuses a pod's copy.

use std::time::Duration;

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

/// Reason of the event on a tenant pod whose copy the super cluster's admission refused.
pub const REASON_REFUSED_BY_SUPER_CLUSTER: &str = "RefusedBySuperCluster";

/// How soon a pod the super cluster refused is tried again.
pub(super) const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// What the tenant is told when the super apiserver refused its pod's copy for what the pod says: the
/// event reason, the message, and when to try again. The super namespace's Pod Security level is the
/// platform's backstop behind podPolicy (not retried: the pod must change); any other admission refusal (a
/// RuntimeClass the super cluster lacks, a webhook, a LimitRange) is tried again now and then, in case the
/// platform changes. `None`: not a refusal, an error to retry with backoff.
pub fn super_refusal(error: &crate::error::Error) -> Option<(&'static str, String, Option<Duration>)> {
    let quoted = error.status_message().unwrap_or_default();
    if error.is_status(403) && quoted.contains("PodSecurity") {
        let message = format!(
            "the super cluster's Pod Security admission refused the pod ({quoted}); the pod is not synced"
        );
        return Some((REASON_POLICY_VIOLATION, message, None));
    }
    refused_by_admission(error).then(|| {
        let message = format!(
            "the super cluster refused the pod ({quoted}); it is retried every {}s",
            REFUSED_RETRY.as_secs()
        );
        (REASON_REFUSED_BY_SUPER_CLUSTER, message, Some(REFUSED_RETRY))
    })
}

/// Whether the super apiserver refused a pod for what the pod says (admission: 400, 422, or a 403 that
/// names a rejection), rather than for the syncer's own rights (an RBAC 403 stays an error, and is not
/// shown to the tenant).
pub fn refused_by_admission(error: &crate::error::Error) -> bool {
    let message = error.status_message().unwrap_or_default();
    error.is_status(400)
        || error.is_status(422)
        || (error.is_status(403)
            && [
                "pod rejected",
                "admission webhook",
                "exceeded quota",
                "maximum",
                "minimum",
            ]
            .iter()
            .any(|m| message.contains(m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_admission_refusals_are_the_tenants_to_see() {
        let refusal = |code: u16, message: &str| {
            crate::error::on_super("creating pod")(kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(refused_by_admission(&refusal(
            403,
            "pod rejected: RuntimeClass \"x\" not found"
        )));
        assert!(refused_by_admission(&refusal(
            422,
            "spec.containers[0].image: Required value"
        )));
        assert!(refused_by_admission(&refusal(
            403,
            "admission webhook \"a.example.com\" denied the request"
        )));
        // The syncer's own rights are the platform's problem, not told to tenants.
        assert!(!refused_by_admission(&refusal(
            403,
            "pods is forbidden: User \"system:serviceaccount:vc:syncer\" cannot create resource \"pods\""
        )));
        assert!(!refused_by_admission(&refusal(
            500,
            "etcdserver: request timed out"
        )));
    }
}
