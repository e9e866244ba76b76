//! The kubelet-client CA bundle: the public CA certificates of every tenant's `kubelet-client` Secret,
//! which vc-manager gathers into one ConfigMap in the platform's namespace, so that vn-agent on every node
//! reads that one ConfigMap instead of every Secret of the cluster.
//!
//! The ConfigMap's keys are cluster keys, its values the CAs (PEM). vn-agent trusts an entry only while a
//! live VirtualCluster computes to its key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use crate::{
    naming::cluster_key,
    wellknown::{
        ANNOTATION_CLUSTER, ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID,
        KUBELET_CLIENT_CA_KEY, SECRET_KUBELET_CLIENT,
    },
};

/// Default name of the bundle ConfigMap (in the platform's namespace).
pub const DEFAULT_CA_BUNDLE: &str = "kubelet-client-cas";

fn annotation<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Result<&'a str, String> {
    annotations
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("annotation {key} is missing"))
}

/// The bundle entry (cluster key, CA PEM) of a `kubelet-client` Secret. A Secret counts only when it is
/// named `kubelet-client`, sits in the root namespace its annotations compute to (namespace, uid and name
/// of its VirtualCluster), and its `ca.crt` is text; otherwise the reason. Only the CA is read: the
/// client key stays where it is.
pub fn bundle_entry(secret: &Secret) -> Result<(String, String), String> {
    let meta = &secret.metadata;
    if meta.name.as_deref() != Some(SECRET_KUBELET_CLIENT) {
        return Err(format!("only Secrets named {SECRET_KUBELET_CLIENT} are read"));
    }
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let key = annotation(annotations, ANNOTATION_CLUSTER)?;
    let vc_namespace = annotation(annotations, ANNOTATION_VC_NAMESPACE)?;
    let vc_name = annotation(annotations, ANNOTATION_VC_NAME)?;
    let vc_uid = annotation(annotations, ANNOTATION_VC_UID)?;
    if key != namespace {
        return Err(format!(
            "it names cluster {key} but lives in namespace {namespace}, not in that tenant's root namespace"
        ));
    }
    let expected = cluster_key(vc_namespace, vc_uid, vc_name);
    if expected != key {
        return Err(format!(
            "cluster {key} is not the cluster key {expected} of VirtualCluster {vc_namespace}/{vc_name} (uid {vc_uid})"
        ));
    }
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBELET_CLIENT_CA_KEY))
        .ok_or_else(|| format!("data key {KUBELET_CLIENT_CA_KEY} is missing"))?;
    let pem = String::from_utf8(ca.0.clone()).map_err(|_| format!("{KUBELET_CLIENT_CA_KEY} is not text"))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(format!("{KUBELET_CLIENT_CA_KEY} holds no certificate"));
    }
    Ok((key.to_owned(), pem))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    fn secret() -> Secret {
        let key = cluster_key("team-a", "uid-a", "dev");
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": SECRET_KUBELET_CLIENT, "namespace": key, "annotations": {
                ANNOTATION_CLUSTER: key, ANNOTATION_VC_NAMESPACE: "team-a", ANNOTATION_VC_NAME: "dev",
                ANNOTATION_VC_UID: "uid-a"}},
            "data": {KUBELET_CLIENT_CA_KEY: base64_of(PEM), "tls.key": base64_of("private")}
        }))
        .expect("secret")
    }

    fn base64_of(text: &str) -> String {
        serde_json::to_value(ByteString(text.as_bytes().to_vec()))
            .expect("bytes")
            .as_str()
            .expect("string")
            .to_owned()
    }

    #[test]
    fn only_a_tenants_own_secret_in_its_root_namespace_gives_an_entry() {
        let good = secret();
        let (key, pem) = bundle_entry(&good).expect("entry");
        assert_eq!(
            (key.as_str(), pem.as_str()),
            (good.metadata.namespace.as_deref().unwrap_or_default(), PEM)
        );

        let mut elsewhere = good.clone();
        elsewhere.metadata.namespace = Some("kube-system".into());
        assert!(
            bundle_entry(&elsewhere)
                .expect_err("elsewhere")
                .contains("root namespace")
        );

        // Annotations claiming another VirtualCluster from this root namespace.
        let mut claims_other = good.clone();
        if let Some(a) = claims_other.metadata.annotations.as_mut() {
            a.insert(ANNOTATION_VC_UID.into(), "uid-b".into());
        }
        assert!(
            bundle_entry(&claims_other)
                .expect_err("other")
                .contains("is not the cluster key")
        );

        let mut renamed = good.clone();
        renamed.metadata.name = Some("other".into());
        assert!(
            bundle_entry(&renamed)
                .expect_err("renamed")
                .contains("only Secrets named")
        );

        let mut unannotated = good.clone();
        if let Some(a) = unannotated.metadata.annotations.as_mut() {
            a.remove(ANNOTATION_CLUSTER);
        }
        assert!(
            bundle_entry(&unannotated)
                .expect_err("no key")
                .contains(ANNOTATION_CLUSTER)
        );

        let mut no_ca = good.clone();
        no_ca.data = None;
        assert!(bundle_entry(&no_ca).expect_err("no ca").contains("missing"));

        let mut not_pem = good;
        not_pem.data = Some([(KUBELET_CLIENT_CA_KEY.to_owned(), ByteString(b"not pem".to_vec()))].into());
        assert!(
            bundle_entry(&not_pem)
                .expect_err("not pem")
                .contains("no certificate")
        );
    }
}
