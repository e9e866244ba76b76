//! The names of the Secrets vc-manager keeps in a tenant's root namespace (the table in
//! `docs/architecture.md`). Names only, so that the PKI that writes these Secrets, vc-manager's legacy
//! templates that mount them and `kubectl vc snapshot` that keeps them read them from one place. The two
//! names other components also read, `kubelet-client` and `admin-kubeconfig`, are in [`crds::wellknown`].

/// Cluster CA: client CA of the apiserver, signer of its serving and client certificates.
pub const SECRET_ROOT_CA: &str = "root-ca";
/// The apiserver's serving certificate (the name is the original project's).
pub const SECRET_APISERVER: &str = "apiserver-ca";
/// etcd CA.
pub const SECRET_ETCD_CA: &str = "etcd-ca";
/// etcd serving and peer certificate.
pub const SECRET_ETCD_SERVER: &str = "etcd-server";
/// The apiserver's etcd client certificate.
pub const SECRET_ETCD_CLIENT: &str = "etcd-client";
/// Front-proxy (aggregation) CA.
pub const SECRET_FRONT_PROXY_CA: &str = "front-proxy-ca";
/// The apiserver's front-proxy client certificate.
pub const SECRET_FRONT_PROXY_CLIENT: &str = "front-proxy-client";
/// Service-account signing key pair (ECDSA, despite the original project's name).
pub const SECRET_SERVICE_ACCOUNT: &str = "serviceaccount-rsa";
/// The CA vn-agent trusts for this tenant.
pub const SECRET_KUBELET_CLIENT_CA: &str = "kubelet-client-ca";
/// The controller-manager's kubeconfig.
pub const SECRET_CONTROLLER_MANAGER_KUBECONFIG: &str = "controller-manager-kubeconfig";
