//! A tenant's etcd through its JSON gateway (`/v3/kv/...`, served by etcd 3.4 and 3.5 on the client
//! port), reached through a port-forward and authenticated with the tenant's `etcd-client` certificate.
//! The transport is a kube client pointed at etcd: the same TLS stack, timeouts and error handling as every
//! other request of `kubectl vc`, and no gRPC stack for three calls.
//!
//! A snapshot reads every key at one revision, page by page ([`EtcdClient::range_page`]): one revision is
//! one consistent state of the store, whatever is written meanwhile. A restore writes keys in
//! transactions ([`EtcdClient::put_batch`]) into an etcd no apiserver has used yet.

use std::{net::SocketAddr, time::Duration};

use base64::Engine as _;
use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use serde_json::json;
use tenant_pki::pki::CertifiedKey;

use crate::{Error, Result};

/// The name the etcd serving certificate is checked against (vc-manager's etcd certificate covers it).
const TLS_SERVER_NAME: &str = "localhost";
/// Keys per page of a snapshot.
pub const PAGE_KEYS: i64 = 500;
/// Largest number of puts in one transaction (etcd's `--max-txn-ops` defaults to 128).
pub const BATCH_OPS: usize = 100;
/// Largest sum of key and value bytes in one transaction (etcd's `--max-request-bytes` defaults to 1.5 MiB,
/// and base64 adds a third).
pub const BATCH_BYTES: usize = 768 * 1024;

/// etcd's int64 fields arrive as JSON strings; zero values are left out.
fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> std::result::Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Int(i64),
    }
    match Number::deserialize(deserializer)? {
        Number::Int(n) => Ok(n),
        Number::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(serde::de::Error::custom)
}

#[derive(Debug, Default, Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "int64")]
    revision: i64,
}

/// A key as the gateway returns it.
#[derive(Debug, Default, Deserialize)]
pub struct KeyValue {
    /// The key.
    #[serde(default, deserialize_with = "bytes")]
    pub key: Vec<u8>,
    /// The value.
    #[serde(default, deserialize_with = "bytes")]
    pub value: Vec<u8>,
    /// The lease the key is attached to (0: none).
    #[serde(default, deserialize_with = "int64")]
    pub lease: i64,
}

#[derive(Debug, Default, Deserialize)]
struct RangeResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    kvs: Vec<KeyValue>,
    #[serde(default)]
    more: bool,
    #[serde(default, deserialize_with = "int64")]
    count: i64,
}

/// One page of keys.
#[derive(Debug)]
pub struct RangePage {
    /// The revision the page was read at.
    pub revision: i64,
    /// The keys, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether keys follow.
    pub more: bool,
}

/// The key after which the next page starts: the smallest key greater than `key`.
pub fn next_key(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// Splits puts into transactions etcd accepts: at most [`BATCH_OPS`] puts and [`BATCH_BYTES`] bytes each
/// (a single larger key goes alone).
pub fn batches(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<&[(Vec<u8>, Vec<u8>)]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, (key, value)) in pairs.iter().enumerate() {
        let this = key.len() + value.len();
        if i > start && (i - start == BATCH_OPS || size + this > BATCH_BYTES) {
            out.push(&pairs[start..i]);
            (start, size) = (i, 0);
        }
        size += this;
    }
    if start < pairs.len() {
        out.push(&pairs[start..]);
    }
    out
}

/// A client of one etcd member's gateway.
#[derive(Clone)]
pub struct EtcdClient {
    client: kube::Client,
    address: SocketAddr,
}

impl EtcdClient {
    /// A client of the etcd at `address` (the port-forward's local end), trusting `ca_pem` and presenting
    /// `client`.
    pub async fn connect(address: SocketAddr, ca_pem: &str, client: &CertifiedKey) -> Result<Self> {
        let server = format!("https://{address}");
        let yaml = tenant_pki::kubeconfig::render("etcd", &server, ca_pem, "etcd-client", client);
        let failed = |problem: String| Error::Etcd {
            address,
            action: "connecting".into(),
            problem,
        };
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).map_err(|e| failed(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| failed(e.to_string()))?;
        config.tls_server_name = Some(TLS_SERVER_NAME.to_owned());
        config.connect_timeout = Some(Duration::from_secs(10));
        config.read_timeout = Some(Duration::from_secs(60));
        vc_runtime::clients::with_user_agent(&mut config);
        let client = kube::Client::try_from(config).map_err(|e| failed(e.to_string()))?;
        Ok(Self { client, address })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        path: &str,
        body: serde_json::Value,
        action: &str,
    ) -> Result<T> {
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes())
            .map_err(|e| Error::Etcd {
                address: self.address,
                action: action.to_owned(),
                problem: e.to_string(),
            })?;
        self.client.request(request).await.map_err(|e| Error::Etcd {
            address: self.address,
            action: action.to_owned(),
            problem: crate::error::api_message(&e),
        })
    }

    /// Up to [`PAGE_KEYS`] keys from `from` on, at `revision` (0: the current one, which the page reports).
    pub async fn range_page(&self, from: &[u8], revision: i64) -> Result<RangePage> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let answer: RangeResponse = self
            .call(
                "/v3/kv/range",
                json!({
                    "key": b64.encode(from),
                    // "\0" as range end: every key from `key` on.
                    "range_end": b64.encode([0u8]),
                    "limit": PAGE_KEYS.to_string(),
                    "revision": revision.to_string(),
                }),
                &format!("reading keys at revision {revision}"),
            )
            .await?;
        Ok(RangePage {
            revision: answer.header.revision,
            kvs: answer.kvs,
            more: answer.more,
        })
    }

    /// How many keys etcd holds now.
    pub async fn count(&self) -> Result<i64> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let answer: RangeResponse = self
            .call(
                "/v3/kv/range",
                json!({"key": b64.encode([0u8]), "range_end": b64.encode([0u8]), "count_only": true}),
                "counting keys",
            )
            .await?;
        Ok(answer.count)
    }

    /// Puts `pairs` in one transaction.
    pub async fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let success: Vec<serde_json::Value> = pairs
            .iter()
            .map(|(key, value)| json!({"request_put": {"key": b64.encode(key), "value": b64.encode(value)}}))
            .collect();
        let _: serde_json::Value = self
            .call(
                "/v3/kv/txn",
                json!({ "success": success }),
                &format!("writing {} keys", pairs.len()),
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_parse_from_the_gateways_json() {
        let page: RangeResponse = serde_json::from_value(json!({
            "header": {"cluster_id": "1", "revision": "42"},
            "kvs": [
                {"key": "L3JlZ2lzdHJ5L2E=", "value": "eA==", "mod_revision": "3"},
                {"key": "L2V2", "value": "", "lease": "7587"}
            ],
            "more": true,
            "count": "900"
        }))
        .expect("parses");
        assert_eq!(page.header.revision, 42);
        assert_eq!(page.kvs[0].key, b"/registry/a");
        assert_eq!(page.kvs[0].value, b"x");
        assert_eq!(page.kvs[0].lease, 0);
        assert_eq!(page.kvs[1].lease, 7587);
        assert!(page.more);
        assert_eq!(page.count, 900);
        let empty: RangeResponse =
            serde_json::from_value(json!({"header": {"revision": "1"}})).expect("parses");
        assert!(empty.kvs.is_empty() && !empty.more && empty.count == 0);
    }

    #[test]
    fn the_next_page_starts_right_after_the_last_key() {
        assert_eq!(next_key(b"/a"), b"/a\0");
        assert!(next_key(b"/a").as_slice() > b"/a".as_slice());
        assert!(next_key(b"/a").as_slice() < b"/a\x01".as_slice());
    }

    #[test]
    fn transactions_stay_under_etcds_limits() {
        let small: Vec<(Vec<u8>, Vec<u8>)> = (0..250).map(|i| (vec![i as u8], vec![0; 10])).collect();
        let sizes: Vec<usize> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let big: Vec<(Vec<u8>, Vec<u8>)> = (0..5).map(|i| (vec![i], vec![0; 400 * 1024])).collect();
        let sizes: Vec<usize> = batches(&big).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [1, 1, 1, 1, 1]);
        let huge = vec![(b"k".to_vec(), vec![0; 2 * BATCH_BYTES])];
        assert_eq!(batches(&huge).len(), 1);
        assert!(batches(&[]).is_empty());
    }
}
