//! The images the upstream conformance suite (`e2e.test`) pulls, made on this machine, where no registry is
//! reachable: agnhost (built from the same Kubernetes source tree as `e2e.test`) with the files its image
//! has, busybox and pause from the images every real node already has, and stand-ins for the web servers
//! (httpd, nginx) that only have to answer HTTP on port 80. Every other image the suite names stays
//! unserved, and the tests that use it fail alike on a plain cluster and in a tenant.
//!
//! Which images and tags come from `e2e.test --list-images`, so one list fits every Kubernetes release.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    Error, RealNodes, Result,
    realnodes::{BUSYBOX_IMAGE, LocalImage, PAUSE_IMAGE},
};

/// What a conformance image is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stand {
    /// agnhost itself, at `/agnhost` as in its upstream image.
    Agnhost,
    /// The nodes' busybox image.
    Busybox,
    /// The nodes' pause image.
    Pause,
    /// agnhost `netexec` answering HTTP on port 80, for httpd and nginx.
    WebServer,
}

impl Stand {
    /// What an upstream reference is served from, by its repository; `None` for images this machine cannot
    /// make, and for every image outside `registry.k8s.io`: the suite names some elsewhere (a private
    /// `gcr.io/k8s-authenticated-test/agnhost`) to see that pulling them fails.
    pub fn of(reference: &str) -> Option<Self> {
        let repository = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
        if repository == "registry.k8s.io/pause" {
            return Some(Self::Pause);
        }
        match repository.strip_prefix("registry.k8s.io/e2e-test-images/")? {
            "agnhost" => Some(Self::Agnhost),
            "busybox" => Some(Self::Busybox),
            "httpd" | "nginx" => Some(Self::WebServer),
            _ => None,
        }
    }

    /// A word for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Agnhost => "agnhost",
            Self::Busybox => "busybox",
            Self::Pause => "pause",
            Self::WebServer => "agnhost netexec on :80",
        }
    }
}

/// What was served and what was not.
#[derive(Debug, Default)]
pub struct ServedImages {
    /// Upstream references and what serves them.
    pub served: Vec<(String, Stand)>,
    /// Upstream references nothing serves.
    pub missing: Vec<String>,
}

/// The images `e2e.test` names (`--list-images`), one full reference per line.
pub fn list_images(e2e_test: &Path) -> Result<Vec<String>> {
    let command = format!("{} --list-images", e2e_test.display());
    let output = Command::new(e2e_test)
        .arg("--list-images")
        .output()
        .map_err(Error::io(format!("running {command}")))?;
    if !output.status.success() {
        return Err(Error::Command {
            context: "listing the conformance suite's images".into(),
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(parse_image_list(&String::from_utf8_lossy(&output.stdout)))
}

/// Lines that look like image references (`host/path:tag`), in order, without repeats.
pub fn parse_image_list(text: &str) -> Vec<String> {
    let mut images: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim) {
        let looks_like_image = !line.is_empty()
            && !line.contains(char::is_whitespace)
            && line.contains('/')
            && line.rsplit('/').next().is_some_and(|last| last.contains(':'));
        if looks_like_image && !images.iter().any(|i| i == line) {
            images.push(line.to_owned());
        }
    }
    images
}

/// Serves the suite's images to every real node: agnhost from `agnhost` (a static binary built from
/// `test/images/agnhost`), the rest as [`Stand`] says.
pub fn serve_images(e2e_test: &Path, agnhost: &Path) -> Result<ServedImages> {
    if !agnhost.is_file() {
        return Err(Error::MissingPart {
            part: format!("agnhost at {}", agnhost.display()),
            hint: "build it from the Kubernetes source tree of e2e.test: go build ./test/images/agnhost"
                .into(),
        });
    }
    let mut report = ServedImages::default();
    for reference in list_images(e2e_test)? {
        let Some(stand) = Stand::of(&reference) else {
            report.missing.push(reference);
            continue;
        };
        match stand {
            Stand::Agnhost => RealNodes::add_local_image(agnhost_image(&reference, agnhost))?,
            Stand::WebServer => RealNodes::add_local_image(web_server_image(&reference, agnhost))?,
            Stand::Busybox => alias(BUSYBOX_IMAGE, &reference)?,
            Stand::Pause => alias(PAUSE_IMAGE, &reference)?,
        }
        report.served.push((reference, stand));
    }
    Ok(report)
}

fn alias(existing: &str, reference: &str) -> Result<()> {
    match RealNodes::alias_image(existing, reference)? {
        true => Ok(()),
        false => Err(Error::MissingPart {
            part: format!("the image {existing} to serve {reference} from"),
            hint: "the real nodes' image store did not build it".into(),
        }),
    }
}

/// agnhost's upstream image, less the Alpine tools it adds: `/agnhost` and its `agnhost-2` link,
/// `/uploads`, and the user and group some tests run as by name.
pub fn agnhost_image(reference: &str, agnhost: &Path) -> LocalImage {
    LocalImage {
        names: vec![reference.to_owned()],
        files: vec![(PathBuf::from(agnhost), "/agnhost".into())],
        links: vec![("/agnhost-2".into(), "/agnhost".into())],
        dirs: vec!["/uploads".into()],
        texts: vec![
            (
                "/etc/passwd".into(),
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n\
                 user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
                    .into(),
            ),
            (
                "/etc/group".into(),
                "root:x:0:\nnobody:x:65534:\nuser-defined-in-image:x:1000:\n\
                 group-defined-in-image:x:50000:user-defined-in-image\n"
                    .into(),
            ),
        ],
        entrypoint: vec!["/agnhost".into()],
        cmd: vec!["pause".into()],
    }
}

/// A web server answering on port 80 (what the suite needs of httpd and nginx): agnhost `netexec`.
pub fn web_server_image(reference: &str, agnhost: &Path) -> LocalImage {
    LocalImage {
        names: vec![reference.to_owned()],
        files: vec![(PathBuf::from(agnhost), "/agnhost".into())],
        entrypoint: vec!["/agnhost".into(), "netexec".into(), "--http-port=80".into()],
        ..LocalImage::default()
    }
}

/// Comparing two runs of the suite from ginkgo's JSON reports (`--json-report`): a plain cluster's and a
/// tenant's.
pub mod report {
    use std::collections::BTreeMap;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct SuiteReport {
        // ginkgo writes `null` for empty lists.
        #[serde(default)]
        spec_reports: Option<Vec<SpecReport>>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct SpecReport {
        #[serde(default)]
        container_hierarchy_texts: Option<Vec<String>>,
        #[serde(default)]
        leaf_node_text: String,
        #[serde(default)]
        leaf_node_type: String,
        state: String,
        #[serde(default)]
        failure: Option<Failure>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Failure {
        #[serde(default)]
        message: String,
    }

    /// One test's outcome.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Outcome {
        /// ginkgo's state: `passed`, `failed`, `skipped`, ...
        pub state: String,
        /// The first line of its failure message.
        pub failure: String,
    }

    /// Outcomes of the run's tests (`It` nodes), by full name.
    pub fn outcomes(text: &str) -> serde_json::Result<BTreeMap<String, Outcome>> {
        let suites: Vec<SuiteReport> = serde_json::from_str(text)?;
        Ok(suites
            .into_iter()
            .flat_map(|suite| suite.spec_reports.unwrap_or_default())
            .filter(|spec| spec.leaf_node_type == "It")
            .map(|spec| {
                let mut name = spec.container_hierarchy_texts.unwrap_or_default().join(" ");
                name.push(' ');
                name.push_str(&spec.leaf_node_text);
                let failure = spec
                    .failure
                    .map(|f| f.message.lines().next().unwrap_or_default().to_owned())
                    .unwrap_or_default();
                (
                    name.trim().to_owned(),
                    Outcome {
                        state: spec.state,
                        failure,
                    },
                )
            })
            .collect())
    }

    /// Counts by state ("passed", "failed", "skipped", ...).
    pub fn counts(outcomes: &BTreeMap<String, Outcome>) -> BTreeMap<&str, usize> {
        let mut counts = BTreeMap::new();
        for outcome in outcomes.values() {
            *counts.entry(outcome.state.as_str()).or_default() += 1;
        }
        counts
    }

    /// Tests that passed on the plain cluster and did not in the tenant (missing there counts as not passed).
    pub fn only_plain_passes<'a>(
        plain: &'a BTreeMap<String, Outcome>,
        tenant: &'a BTreeMap<String, Outcome>,
    ) -> Vec<(&'a str, Option<&'a Outcome>)> {
        plain
            .iter()
            .filter(|(_, outcome)| outcome.state == "passed")
            .filter_map(|(name, _)| match tenant.get(name) {
                Some(outcome) if outcome.state == "passed" => None,
                other => Some((name.as_str(), other)),
            })
            .collect()
    }

    /// A ginkgo `--focus` regular expression matching exactly the tests that passed in `outcomes` (each
    /// name escaped and anchored at its end, and after a space or the start: ginkgo matches the suite's
    /// description, a space and the test's name): to run in a tenant only what passed on the plain cluster.
    pub fn focus_on_passed(outcomes: &BTreeMap<String, Outcome>) -> String {
        let names: Vec<String> = outcomes
            .iter()
            .filter(|(_, outcome)| outcome.state == "passed")
            .map(|(name, _)| escape(name))
            .collect();
        format!("(?:^| )({})$", names.join("|"))
    }

    /// `text` as a literal in a Go (RE2) regular expression.
    fn escape(text: &str) -> String {
        let mut escaped = String::with_capacity(text.len());
        for c in text.chars() {
            if "\\.+*?()|[]{}^$".contains(c) {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        escaped
    }

    pub fn summary(what: &str, outcomes: &BTreeMap<String, Outcome>) -> String {
        let counts = counts(outcomes);
        let states = counts
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{what:<14} {} tests: {states}", outcomes.len())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_focus_on_passed_tests_names_each_literally_and_nothing_else() {
            let text = report(&[
                ("works [Conformance]", "passed", ""),
                ("fails (badly) [Conformance]", "failed", "boom"),
                ("a.b|c? [Conformance]", "passed", ""),
            ]);
            let focus = focus_on_passed(&outcomes(&text).expect("report"));
            assert_eq!(
                focus,
                r"(?:^| )(\[sig-x\] Thing a\.b\|c\? \[Conformance\]|\[sig-x\] Thing works \[Conformance\])$"
            );
        }

        fn report(specs: &[(&str, &str, &str)]) -> String {
            let specs: Vec<_> = specs
                .iter()
                .map(|(name, state, message)| {
                    serde_json::json!({
                        "ContainerHierarchyTexts": ["[sig-x] Thing"],
                        "LeafNodeText": name,
                        "LeafNodeType": "It",
                        "State": state,
                        "Failure": {"Message": message},
                    })
                })
                .chain(std::iter::once(serde_json::json!({
                    "LeafNodeType": "SynchronizedBeforeSuite", "State": "passed",
                })))
                .collect();
            serde_json::json!([{ "SpecReports": specs }]).to_string()
        }

        #[test]
        fn a_test_failing_only_in_the_tenant_is_listed_with_its_reason() {
            let plain = outcomes(&report(&[
                ("works [Conformance]", "passed", ""),
                ("breaks [Conformance]", "passed", ""),
                ("broken everywhere [Conformance]", "failed", "no image"),
            ]))
            .unwrap();
            let tenant = outcomes(&report(&[
                ("works [Conformance]", "passed", ""),
                ("breaks [Conformance]", "failed", "timed out\nmore"),
                ("broken everywhere [Conformance]", "failed", "no image"),
            ]))
            .unwrap();
            assert_eq!(plain.len(), 3, "only It nodes count");
            assert_eq!(counts(&tenant).get("failed"), Some(&2));
            let only = only_plain_passes(&plain, &tenant);
            assert_eq!(only.len(), 1);
            assert_eq!(only[0].0, "[sig-x] Thing breaks [Conformance]");
            assert_eq!(only[0].1.unwrap().failure, "timed out");
        }

        #[test]
        fn a_test_the_tenant_never_ran_counts_against_it() {
            let plain = outcomes(&report(&[("a", "passed", "")])).unwrap();
            let tenant = outcomes(&report(&[])).unwrap();
            assert_eq!(
                only_plain_passes(&plain, &tenant),
                vec![("[sig-x] Thing a", None)]
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_served_by_their_repository_name() {
        let cases = [
            (
                "registry.k8s.io/e2e-test-images/agnhost:2.53",
                Some(Stand::Agnhost),
            ),
            (
                "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
                Some(Stand::Busybox),
            ),
            ("registry.k8s.io/pause:3.10", Some(Stand::Pause)),
            (
                "registry.k8s.io/e2e-test-images/httpd:2.4.38-4",
                Some(Stand::WebServer),
            ),
            (
                "registry.k8s.io/e2e-test-images/nginx:1.15-4",
                Some(Stand::WebServer),
            ),
            ("registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7", None),
            ("registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2", None),
            // A repository that merely ends like one is not it.
            ("registry.k8s.io/e2e-test-images/not-agnhost:1", None),
            // Pulling these must fail: the suite tests that it does.
            ("gcr.io/k8s-authenticated-test/agnhost:2.6", None),
            ("invalid.registry.k8s.io/invalid/alpine:3.1", None),
        ];
        for (reference, expected) in cases {
            assert_eq!(Stand::of(reference), expected, "{reference}");
        }
    }

    #[test]
    fn the_list_keeps_references_only_once() {
        let text = "I1125 some log line\nregistry.k8s.io/pause:3.10\n\
                    registry.k8s.io/e2e-test-images/agnhost:2.53\nregistry.k8s.io/pause:3.10\n\n";
        assert_eq!(
            parse_image_list(text),
            vec![
                "registry.k8s.io/pause:3.10".to_owned(),
                "registry.k8s.io/e2e-test-images/agnhost:2.53".to_owned()
            ]
        );
    }

    #[test]
    fn agnhost_runs_as_upstream() {
        let image = agnhost_image("r/agnhost:1", Path::new("/tmp/agnhost"));
        assert_eq!(image.entrypoint, vec!["/agnhost"]);
        assert_eq!(image.cmd, vec!["pause"]);
        assert!(
            image
                .texts
                .iter()
                .any(|(p, t)| p == "/etc/passwd" && t.contains(":1000:"))
        );
    }
}
