//! Seccomp and AppArmor profiles (fields and the annotations older clusters read) and capabilities.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Capabilities, PodSpec};

use super::input::{ContainerView, PolicyInput};

/// Annotation prefix of the AppArmor profile of a container (before the `appArmorProfile` field).
pub(super) const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// Annotation of a pod's seccomp profile (before the `seccompProfile` field).
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// Annotation prefix of a container's seccomp profile (before the `seccompProfile` field).
pub(super) const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

/// Seccomp and AppArmor profiles (fields and the annotations older clusters read) and capabilities.
pub(super) fn security_profiles(
    spec: &PodSpec,
    containers: &[ContainerView<'_>],
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
    found: &mut Vec<String>,
) {
    let policy = input.tenant;
    let mut profile = |where_: String, kind: &str| match kind {
        "Unconfined" if !policy.unconfined => {
            found.push(format!("{where_} Unconfined (podPolicy.unconfined)"));
        }
        "Localhost" if !policy.localhost_profiles => {
            found.push(format!("{where_} Localhost (podPolicy.localhostProfiles)"));
        }
        _ => {}
    };
    if let Some(pod) = &spec.security_context {
        if let Some(seccomp) = &pod.seccomp_profile {
            profile("pod seccompProfile".to_owned(), &seccomp.type_);
        }
        if let Some(apparmor) = &pod.app_armor_profile {
            profile("pod appArmorProfile".to_owned(), &apparmor.type_);
        }
    }
    for c in containers {
        let Some(security) = c.security else {
            continue;
        };
        if let Some(seccomp) = &security.seccomp_profile {
            profile(
                format!("seccompProfile of {} {:?}", c.kind, c.name),
                &seccomp.type_,
            );
        }
        if let Some(apparmor) = &security.app_armor_profile {
            profile(
                format!("appArmorProfile of {} {:?}", c.kind, c.name),
                &apparmor.type_,
            );
        }
    }
    for (key, value) in annotations.into_iter().flatten() {
        let legacy = key.starts_with(APPARMOR_ANNOTATION_PREFIX)
            || key == SECCOMP_POD_ANNOTATION
            || key.starts_with(SECCOMP_CONTAINER_ANNOTATION_PREFIX);
        if !legacy {
            continue;
        }
        if value == "unconfined" {
            profile(format!("annotation {key}"), "Unconfined");
        } else if value.starts_with("localhost/") {
            profile(format!("annotation {key}"), "Localhost");
        }
    }
    let allowed = |capability: &str| {
        let name = capability
            .strip_prefix("CAP_")
            .unwrap_or(capability)
            .to_ascii_uppercase();
        input
            .platform
            .allowed_capabilities
            .iter()
            .chain(&policy.capabilities)
            .any(|a| a.strip_prefix("CAP_").unwrap_or(a).eq_ignore_ascii_case(&name))
    };
    for c in containers {
        let added = c
            .security
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|Capabilities { add, .. }| add.as_ref());
        for capability in added.into_iter().flatten().filter(|cap| !allowed(cap)) {
            found.push(format!(
                "capability {capability} of {} {:?} (the syncer's --pod-allowed-capabilities or podPolicy.capabilities)",
                c.kind, c.name
            ));
        }
    }
}
