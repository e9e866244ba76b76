use std::sync::Arc;

use crds::VirtualCluster;
use serde_json::{Value, json};

use super::{
    handover::{balance_once, drop_everything},
    *,
};
use crate::engine::context::{
    Context,
    testing::{self, from_json, put},
};

const NS: &str = "vc-system";

fn settings(replica: &str) -> ShardSettings {
    ShardSettings {
        replica_id: replica.into(),
        namespace: NS.into(),
        lease_duration: Duration::from_secs(6),
    }
}

fn lease(name: &str, role: &str, holder: Option<&str>, version: &str, key: Option<&str>) -> Lease {
    let mut annotations = serde_json::Map::new();
    if let Some(key) = key {
        annotations.insert(ANNOTATION_CLUSTER.into(), json!(key));
    }
    from_json(json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": version,
            "labels": {LABEL_SYNCER_LEASE: role}, "annotations": annotations},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 6, "leaseTransitions": 2}
    }))
}

fn virtual_cluster(name: &str, weight: u32) -> VirtualCluster {
    from_json(json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
        "spec": {"kubeconfigSecretRef": {"name": "kc"}, "weight": weight},
    }))
}

fn key_of(vc: &VirtualCluster) -> String {
    crds::naming::cluster_key_of(vc).expect("key")
}

/// A context whose VirtualCluster cache holds `vcs`, with sharding on as `replica`.
fn sharded(super_client: kube::Client, replica: &str, vcs: &[VirtualCluster]) -> (Context, Arc<Shards>) {
    let (mut ctx, _) = testing::context(super_client);
    let (store, mut writer) = kube::runtime::reflector::store();
    for vc in vcs {
        put(&mut writer, vc.clone());
    }
    ctx.virtual_clusters = store;
    let shards = Arc::new(Shards::new(settings(replica)));
    shards.listed.store(true, Ordering::Release);
    // Joined long ago: no waiting for peers.
    let _ = shards.joined.set(Instant::now() - Duration::from_secs(60));
    ctx.shards = Some(shards.clone());
    (ctx, shards)
}

fn leases(shards: &Arc<Shards>, client: kube::Client) -> Leases {
    Leases {
        api: Api::namespaced(client, NS),
        shards: shards.clone(),
    }
}

fn holder_of(body: &Value) -> Option<&str> {
    body["spec"]["holderIdentity"].as_str()
}

/// What a look asked of the [`Handover`], in order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Asked {
    Stop(String),
    Remove(String),
    Duties,
}

fn stop(key: &str) -> Asked {
    Asked::Stop(key.into())
}

/// A [`Handover`] that records what it is asked, so that a test states what a look does to tenants.
#[derive(Default)]
struct Recorded(std::sync::Mutex<Vec<Asked>>);

impl Recorded {
    fn asked(&self) -> Vec<Asked> {
        self.0.lock().expect("not poisoned").clone()
    }

    fn ask(&self, asked: Asked) {
        self.0.lock().expect("not poisoned").push(asked);
    }
}

impl Handover for Recorded {
    fn stop(&self, cluster_key: &str) {
        self.ask(stop(cluster_key));
    }

    async fn remove(&self, cluster_key: &str) {
        self.ask(Asked::Remove(cluster_key.into()));
    }

    async fn run_duties(&self) {
        self.ask(Asked::Duties);
    }
}

#[test]
fn replica_ids_must_name_a_lease() {
    assert_eq!(replica_id(" syncer-7d9f-x2 ").as_deref(), Ok("syncer-7d9f-x2"));
    for bad in ["", "Syncer", "a/b", "-a", "a-", &"a".repeat(240)] {
        assert!(replica_id(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(replica_of("syncer-0/0a1b"), "syncer-0");
    assert_eq!(replica_of("bare"), "bare");
}

#[test]
fn the_step_follows_the_lease_and_the_assignment() {
    let me = "a/1";
    let live: HashSet<&str> = ["a/1", "b/1"].into();
    let held_by = |h: Option<&str>| lease("l", ROLE_TENANT, h, "5", Some("k"));
    // Ours to take.
    assert_eq!(step(me, true, None, false, &live), Step::Create);
    assert_eq!(
        step(me, true, Some(&held_by(None)), false, &live),
        Step::Take { expired: false }
    );
    assert_eq!(
        step(me, true, Some(&held_by(Some("c/1"))), false, &live),
        Step::Take { expired: true }
    );
    assert_eq!(
        step(me, true, Some(&held_by(Some("b/1"))), false, &live),
        Step::Wait
    );
    // A restarted b (new instance) does not inherit the old one's Leases: they are free once b/0 is gone.
    assert_eq!(
        step(me, true, Some(&held_by(Some("b/0"))), false, &live),
        Step::Take { expired: true }
    );
    assert_eq!(step(me, true, Some(&held_by(Some(me))), false, &live), Step::Hold);
    assert_eq!(step(me, true, Some(&held_by(Some(me))), true, &live), Step::Hold);
    // Not ours.
    assert_eq!(
        step(me, false, Some(&held_by(Some(me))), true, &live),
        Step::HandOver
    );
    assert_eq!(
        step(me, false, Some(&held_by(Some(me))), false, &live),
        Step::HandOver
    );
    assert_eq!(
        step(me, false, Some(&held_by(Some("b/1"))), false, &live),
        Step::Nothing
    );
    assert_eq!(step(me, false, None, false, &live), Step::Nothing);
    // Held here, but the Lease says otherwise: stop at once, whoever should own it.
    for ours in [true, false] {
        assert_eq!(
            step(me, ours, Some(&held_by(Some("b/1"))), true, &live),
            Step::Lost
        );
        assert_eq!(step(me, ours, None, true, &live), Step::Lost);
    }
}

#[test]
fn members_are_live_while_their_lease_changes_within_its_duration() {
    let now = Instant::now();
    let seen = |lease: Lease, ago: u64| Observed {
        lease: Arc::new(lease),
        since: now - Duration::from_secs(ago),
    };
    let observed: HashMap<String, Observed> = [
        ("m-a", seen(lease("m-a", ROLE_MEMBER, Some("a/1"), "1", None), 1)),
        ("m-b", seen(lease("m-b", ROLE_MEMBER, Some("b/1"), "1", None), 7)),
        ("m-c", seen(lease("m-c", ROLE_MEMBER, None, "1", None), 0)),
        ("t", seen(lease("t", ROLE_TENANT, Some("d/1"), "1", Some("k")), 0)),
    ]
    .into_iter()
    .map(|(n, o)| (n.to_owned(), o))
    .collect();
    let live = live_members(&observed, now);
    assert_eq!(live, [("a".to_owned(), "a/1".to_owned())].into());
}

#[test]
fn an_older_version_of_a_lease_never_replaces_a_newer_one() {
    let shards = Shards::new(settings("a"));
    let start = Instant::now();
    shards.observe(lease("l", ROLE_TENANT, Some("a/1"), "10", None), start);
    // Our own write's answer came first; the watch now delivers the version before it.
    shards.observe(
        lease("l", ROLE_TENANT, Some("b/1"), "9", None),
        start + Duration::from_secs(1),
    );
    let seen = &shards.snapshot()["l"];
    assert_eq!(holder(&seen.lease), Some("a/1"));
    assert_eq!(seen.since, start);
    // The same version again does not reset the time it was first seen; a newer one does.
    shards.observe(
        lease("l", ROLE_TENANT, Some("a/1"), "10", None),
        start + Duration::from_secs(2),
    );
    assert_eq!(shards.snapshot()["l"].since, start);
    shards.observe(
        lease("l", ROLE_TENANT, Some("b/1"), "11", None),
        start + Duration::from_secs(3),
    );
    assert_eq!(shards.snapshot()["l"].since, start + Duration::from_secs(3));
}

#[tokio::test]
async fn nothing_is_granted_without_a_valid_membership_and_a_lapse_drops_everything() {
    let (client, _) = testing::mock();
    let (ctx, shards) = sharded(client, "a", &[]);
    assert!(!shards.grant("t1"), "granted before the first renewal");
    shards.renewed(Instant::now());
    assert!(shards.grant("t1") && shards.grant("t2"));
    assert!(ctx.owns("t1") && !ctx.owns("t3"));
    let mut changes = shards.subscribe();
    changes.mark_unchanged();
    let hands = Recorded::default();
    // Still valid: nothing is dropped.
    assert_eq!(drop_everything(&ctx, &shards, &hands), 0);
    assert_eq!(hands.asked(), []);
    // Renewed last longer ago than the renew deadline.
    shards.renewed(Instant::now() - shards.settings.renew_deadline() - Duration::from_millis(1));
    assert_eq!(drop_everything(&ctx, &shards, &hands), 2);
    assert!(!ctx.owns("t1") && !ctx.owns("t2"));
    let mut asked = hands.asked();
    asked.sort();
    assert_eq!(asked, [stop("t1"), stop("t2")], "both stopped");
    assert!(changes.has_changed().expect("open"), "supervisors are told");
    assert!(!shards.grant("t1"));
    assert_eq!(ctx.admit("t1", || ()), None, "no attach without the Lease");
}

/// A lone replica creates the Leases of every tenant and of the duties, then holds them without writing.
#[tokio::test]
async fn a_lone_replica_takes_every_tenant_and_the_duties() {
    let (client, mut supers) = testing::mock();
    let vcs = [virtual_cluster("one", 1), virtual_cluster("two", 5)];
    let (ctx, shards) = sharded(client.clone(), "a", &vcs);
    shards.renewed(Instant::now());
    let leases = leases(&shards, client);
    let instance = shards.instance().to_owned();
    let (back, returned) = tokio::sync::oneshot::channel();
    let expected: HashSet<String> = vcs.iter().map(|vc| tenant_lease_name(&key_of(vc))).collect();
    let script = async move {
        let mut created = HashSet::new();
        for _ in 0..2 {
            let call = supers
                .expect(
                    "POST",
                    &format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"),
                )
                .await;
            assert_eq!(holder_of(&call.body), Some(instance.as_str()));
            assert_eq!(call.body["metadata"]["labels"][LABEL_SYNCER_LEASE], ROLE_TENANT);
            created.insert(
                call.body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            call.echo();
        }
        assert_eq!(created, expected);
        let duties = supers
            .expect(
                "POST",
                &format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"),
            )
            .await;
        assert_eq!(duties.body["metadata"]["name"], DUTIES_LEASE);
        duties.echo();
        supers.idle().await;
        let _ = back.send(supers);
    };
    let hands = Recorded::default();
    mock_apiserver::run(script, balance_once(&ctx, &leases, &hands)).await;
    for vc in &vcs {
        assert!(ctx.owns(&key_of(vc)));
    }
    assert_eq!(
        hands.asked(),
        [Asked::Duties],
        "nothing stopped; the duties' chores run"
    );
    assert!(ctx.runs_cluster_duties());
    assert_eq!(ctx.metrics.shards.shard_owned_tenants.get(), 2);
    // The next look writes nothing: tenant Leases are not renewed one by one.
    let mut supers = returned.await.expect("script done");
    let quiet = async move { supers.idle().await };
    mock_apiserver::run(quiet, balance_once(&ctx, &leases, &hands)).await;
    assert!(ctx.owns(&key_of(&vcs[0])));
    assert_eq!(hands.asked(), [Asked::Duties, Asked::Duties]);
}

/// A tenant Lease whose holder is no longer a member is taken (one update, pinned to the version read); one
/// held by a live member is left alone; a tenant the assignment gives to another live member is detached
/// and released.
#[tokio::test]
async fn dead_holders_leases_are_taken_and_others_handed_over() {
    let (client, mut supers) = testing::mock();
    // Enough tenants that both members get some.
    let vcs: Vec<VirtualCluster> = (0..8).map(|i| virtual_cluster(&format!("vc-{i}"), 1)).collect();
    let (ctx, shards) = sharded(client.clone(), "a", &vcs);
    shards.renewed(Instant::now());
    let now = Instant::now();
    shards.observe(
        lease(&member_lease_name("b"), ROLE_MEMBER, Some("b/1"), "1", None),
        now,
    );
    let owners = assign(
        &vcs.iter()
            .map(|vc| Placed {
                key: key_of(vc),
                weight: 1,
            })
            .collect::<Vec<_>>(),
        &["a", "b"],
    );
    let mine: Vec<String> = owners
        .iter()
        .filter(|(_, m)| *m == "a")
        .map(|(k, _)| k.clone())
        .collect();
    let theirs: Vec<String> = owners
        .iter()
        .filter(|(_, m)| *m == "b")
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!mine.is_empty() && !theirs.is_empty(), "{owners:?}");
    let instance = shards.instance().to_owned();
    // Ours: the first held by a replica that died (c), the rest by b, which is live (it hands them over
    // on its side). Theirs: the first held by us, to hand over.
    for (i, key) in mine.iter().enumerate() {
        let by = if i == 0 { "c/1" } else { "b/1" };
        shards.observe(
            lease(&tenant_lease_name(key), ROLE_TENANT, Some(by), "7", Some(key)),
            now,
        );
    }
    shards.observe(
        lease(
            &tenant_lease_name(&theirs[0]),
            ROLE_TENANT,
            Some(&instance),
            "8",
            Some(&theirs[0]),
        ),
        now,
    );
    shards.observe(lease(DUTIES_LEASE, ROLE_DUTIES, Some("b/1"), "3", None), now);
    // We sync theirs[0] now.
    assert!(shards.grant(&theirs[0]));
    let leases = leases(&shards, client);
    let (taken, released) = (tenant_lease_name(&mine[0]), tenant_lease_name(&theirs[0]));
    let script = async move {
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/");
        let take = supers.expect("PATCH", &format!("{path}{taken}")).await;
        assert_eq!(holder_of(&take.body), Some(instance.as_str()));
        assert_eq!(
            take.body["metadata"]["resourceVersion"], "7",
            "pinned to the version read"
        );
        assert_eq!(take.body["spec"]["leaseTransitions"], 3);
        take.echo();
        let release = supers.expect("PATCH", &format!("{path}{released}")).await;
        assert_eq!(holder_of(&release.body), None);
        assert_eq!(release.body["metadata"]["resourceVersion"], "8");
        release.echo();
        // The duties' Lease is b's, which is live: nothing is written for it whoever should hold it.
        supers.idle().await;
    };
    let hands = Recorded::default();
    mock_apiserver::run(script, balance_once(&ctx, &leases, &hands)).await;
    assert!(ctx.owns(&mine[0]));
    assert_eq!(
        hands.asked(),
        [stop(&theirs[0])],
        "only the tenant handed over is stopped; the duties are b's"
    );
    assert!(mine[1..].iter().all(|k| !ctx.owns(k)), "taken from a live member");
    assert!(!ctx.owns(&theirs[0]));
    assert!(!ctx.runs_cluster_duties());
    let count = |reason| {
        ctx.metrics
            .shards
            .shard_handovers
            .get_or_create(&crate::tenancy::shards::metrics::HandoverLabels { reason })
            .get()
    };
    assert_eq!((count("taken_over"), count("released")), (1, 1));
}

/// A tenant whose VirtualCluster is gone is stopped and its super namespaces removed by the replica that
/// held its Lease, which then deletes the Lease (pinned to its uid and version); a tenant synced here whose
/// Lease another live replica holds is stopped at once.
#[tokio::test]
async fn deleted_tenants_are_removed_and_lost_ones_stopped() {
    let (client, mut supers) = testing::mock();
    let vcs = [virtual_cluster("kept", 1)];
    let (ctx, shards) = sharded(client.clone(), "a", &vcs);
    shards.renewed(Instant::now());
    let now = Instant::now();
    let instance = shards.instance().to_owned();
    let kept = key_of(&vcs[0]);
    shards.observe(
        lease(&member_lease_name("b"), ROLE_MEMBER, Some("b/1"), "1", None),
        now,
    );
    shards.observe(
        lease(
            &tenant_lease_name(&kept),
            ROLE_TENANT,
            Some("b/1"),
            "5",
            Some(&kept),
        ),
        now,
    );
    let gone = tenant_lease_name("gone");
    shards.observe(lease(&gone, ROLE_TENANT, Some(&instance), "4", Some("gone")), now);
    // Held by b, which is live: whoever should hold the duties, nothing is written for them.
    shards.observe(lease(DUTIES_LEASE, ROLE_DUTIES, Some("b/1"), "3", None), now);
    assert!(shards.grant(&kept) && shards.grant("gone"));
    let leases = leases(&shards, client);
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{gone}?");
    let script = async move {
        let delete = supers.expect("DELETE", &path).await;
        assert_eq!(delete.body["preconditions"]["uid"], format!("uid-{gone}"));
        assert_eq!(delete.body["preconditions"]["resourceVersion"], "4");
        delete.ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
        supers.idle().await;
    };
    let hands = Recorded::default();
    mock_apiserver::run(script, balance_once(&ctx, &leases, &hands)).await;
    assert_eq!(
        hands.asked(),
        [stop(&kept), stop("gone"), Asked::Remove("gone".into())]
    );
    assert!(!ctx.owns(&kept) && !ctx.owns("gone"));
    assert!(
        !shards.snapshot().contains_key(&tenant_lease_name("gone")),
        "forgotten"
    );
    let lost = ctx
        .metrics
        .shards
        .shard_handovers
        .get_or_create(&crate::tenancy::shards::metrics::HandoverLabels { reason: "lost" })
        .get();
    assert_eq!(lost, 1);
}

/// The membership Lease is created when missing and renewed in place; one held by another instance of the
/// same replica (a predecessor not yet expired) is left alone and the membership stays invalid.
#[tokio::test]
async fn the_membership_lease_is_created_renewed_and_not_stolen() {
    let (client, mut supers) = testing::mock();
    let shards = Arc::new(Shards::new(settings("a")));
    let leases = leases(&shards, client);
    let name = member_lease_name("a");
    let instance = shards.instance().to_owned();
    let script = async move {
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
        supers
            .expect("GET", &format!("{path}/{name}"))
            .await
            .not_found("leases", &name);
        let create = supers.expect("POST", &path).await;
        assert_eq!(holder_of(&create.body), Some(instance.as_str()));
        assert_eq!(create.body["metadata"]["labels"][LABEL_SYNCER_LEASE], ROLE_MEMBER);
        create.echo();
        let renew = supers.expect("PATCH", &format!("{path}/{name}")).await;
        assert_eq!(holder_of(&renew.body), Some(instance.as_str()));
        assert_eq!(renew.body["metadata"]["resourceVersion"], "200");
        let mut answer = renew.body.clone();
        answer["metadata"]["resourceVersion"] = json!("201");
        renew.ok(answer);
        supers.idle().await;
    };
    mock_apiserver::run(script, async {
        renew_membership(&leases, &member_lease_name("a"))
            .await
            .expect("created");
        renew_membership(&leases, &member_lease_name("a"))
            .await
            .expect("renewed");
    })
    .await;

    let (client, mut supers) = testing::mock();
    let successor = Arc::new(Shards::new(settings("a")));
    successor.observe(
        lease(
            &member_lease_name("a"),
            ROLE_MEMBER,
            Some("a/predecessor"),
            "4",
            None,
        ),
        Instant::now(),
    );
    let leases = Leases {
        api: Api::namespaced(client, NS),
        shards: successor.clone(),
    };
    let quiet = async move { supers.idle().await };
    let refused = mock_apiserver::run(quiet, renew_membership(&leases, &member_lease_name("a"))).await;
    assert!(matches!(refused, Err(Error::LeaseHeld { .. })), "{refused:?}");
    assert!(!successor.member_at(Instant::now()));
}
