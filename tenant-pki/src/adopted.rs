//! An adopted tenant's kubeconfig, as vc-manager adopts it and `kubectl vc kubeconfig` hands it out: from
//! the VirtualCluster's inline annotation, or from a Secret of its namespace labelled for it.

use base64::{Engine, engine::general_purpose::STANDARD};
use crds::{VirtualCluster, v1alpha1::Adoption};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use crate::{Error, Result};

/// Reads the kubeconfig of an adopted tenant with `client` (the super cluster): `(where it came from, YAML)`.
/// Nothing of the kubeconfig is told in an error: parse errors quote their input, and a kubeconfig holds
/// credentials.
pub async fn read_kubeconfig(
    vc: &VirtualCluster,
    adoption: &Adoption,
    client: &kube::Client,
) -> Result<(String, String)> {
    let namespace = vc.namespace().unwrap_or_default();
    match adoption {
        Adoption::InlineBase64(encoded) => {
            let origin = format!(
                "annotation {} of VirtualCluster {namespace}/{}",
                crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG,
                vc.name_any()
            );
            Ok((origin.clone(), decode_inline(encoded, &origin)?))
        }
        Adoption::Secret(reference) => {
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let secret = api
                .get_opt(&reference.name)
                .await
                .map_err(|source| Error::KubeconfigSecretRead {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                    source,
                })?
                .ok_or_else(|| Error::KubeconfigSecretNotFound {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                })?;
            from_secret(vc, &secret, &reference.name, &reference.key)
        }
    }
}

/// The kubeconfig in the original project's inline annotation (base64), read from `origin`.
pub fn decode_inline(encoded: &str, origin: &str) -> Result<String> {
    // The decoder's errors name the offending byte: told without it.
    let bytes = STANDARD
        .decode(encoded.trim())
        .map_err(|_| Error::KubeconfigInvalid {
            origin: origin.to_owned(),
            problem: "not valid base64".into(),
        })?;
    String::from_utf8(bytes).map_err(|_| Error::KubeconfigInvalid {
        origin: origin.to_owned(),
        problem: "not UTF-8 text".into(),
    })
}

/// The kubeconfig under `key` of `secret` (named `name` in the VirtualCluster's namespace): only from a
/// Secret labelled for this VirtualCluster, so that an editor who may not write Secrets cannot point it at
/// one that was meant for something else (and have it read here).
pub fn from_secret(vc: &VirtualCluster, secret: &Secret, name: &str, key: &str) -> Result<(String, String)> {
    let namespace = vc.namespace().unwrap_or_default();
    crds::tenant::kubeconfig_secret_meant_for(&secret.metadata, &vc.name_any())
        .map_err(|problem| Error::KubeconfigSecretRefused { problem })?;
    let origin = format!("Secret {namespace}/{name} key {key}");
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| Error::KubeconfigKeyMissing {
            namespace: namespace.clone(),
            name: name.to_owned(),
            key: key.to_owned(),
        })?;
    let yaml = String::from_utf8(bytes).map_err(|_| Error::KubeconfigInvalid {
        origin: origin.clone(),
        problem: "not UTF-8 text".into(),
    })?;
    Ok((origin, yaml))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn vc() -> VirtualCluster {
        let mut vc = VirtualCluster::new("dev", Default::default());
        vc.metadata.namespace = Some("team".into());
        vc
    }

    fn secret(label: Option<&str>, data: Option<&[u8]>) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some("kc".into());
        secret.metadata.namespace = Some("team".into());
        secret.metadata.labels =
            label.map(|l| [(crds::wellknown::LABEL_KUBECONFIG_FOR.to_owned(), l.to_owned())].into());
        secret.data = data.map(|d| [("value".to_owned(), ByteString(d.to_vec()))].into());
        secret
    }

    #[test]
    fn a_labelled_secret_gives_its_key_and_nothing_else_is_read() {
        let (origin, yaml) =
            from_secret(&vc(), &secret(Some("dev"), Some(b"kind: Config")), "kc", "value").expect("read");
        assert_eq!(
            (origin.as_str(), yaml.as_str()),
            ("Secret team/kc key value", "kind: Config")
        );
        let refused =
            from_secret(&vc(), &secret(Some("other"), Some(b"x")), "kc", "value").expect_err("refused");
        assert_eq!(
            refused.reason(),
            crds::wellknown::REASON_KUBECONFIG_SECRET_REFUSED
        );
        let missing = from_secret(&vc(), &secret(Some("dev"), None), "kc", "value").expect_err("no key");
        assert_eq!(
            missing.to_string(),
            "kubeconfig Secret team/kc has no key \"value\""
        );
        let binary =
            from_secret(&vc(), &secret(Some("dev"), Some(&[0xff, 0xfe])), "kc", "value").expect_err("binary");
        assert_eq!(
            binary.to_string(),
            "kubeconfig from Secret team/kc key value cannot be used: not UTF-8 text"
        );
    }

    #[test]
    fn the_inline_annotation_is_base64_of_utf8_and_errors_quote_nothing() {
        assert_eq!(
            decode_inline(&STANDARD.encode("kind: Config"), "here").expect("decoded"),
            "kind: Config"
        );
        let bad = decode_inline("secret-bytes!!", "here").expect_err("not base64");
        assert!(!bad.to_string().contains("secret-bytes"), "{bad}");
        assert_eq!(bad.reason(), "KubeconfigInvalid");
    }
}
