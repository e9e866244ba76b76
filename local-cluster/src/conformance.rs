//! The images the upstream conformance suite (`e2e.test`) pulls, made on this machine, where no registry is
//! reachable: agnhost (built from the same Kubernetes source tree as `e2e.test`) with the files and tools
//! its image has, Debian's busybox laid out as the upstream busybox image is, pause from the image every
//! real node already has, and stand-ins for the images that only serve files over HTTP (httpd, nginx, the
//! Update Demo's kitten and nautilus) and for `jessie-dnsutils`. Every other image the suite names stays
//! unserved, and the tests that use it fail alike on a plain cluster and in a tenant.
//!
//! Which images and tags come from `e2e.test --list-images`, so one list fits every Kubernetes release.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    Error, RealNodes, Result,
    pki::{CertificateAuthority, Usage},
    realnodes::{LocalImage, PAUSE_IMAGE, host::find_tool},
};

/// What a conformance image is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stand {
    /// agnhost itself, at `/agnhost` as in its upstream image, with that image's tools ([`AGNHOST_TOOLS`]).
    Agnhost,
    /// `jessie-dnsutils` (Debian with dig and getent, for the DNS tests' probes): the agnhost image, which
    /// has those tools.
    DnsUtils,
    /// Debian's busybox laid out as the upstream busybox image is.
    Busybox,
    /// The nodes' pause image.
    Pause,
    /// A web server answering on port 80 with `index.html` from `root`, which tests move away to fail a
    /// readiness probe (httpd and nginx): busybox `httpd`.
    WebServer {
        /// The document root of the upstream image.
        root: &'static str,
    },
    /// The Update Demo's images: agnhost `test-webserver` serving `/data.json`, which names `picture`.
    UpdateDemo {
        /// The picture the image's data names.
        picture: &'static str,
    },
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
            "jessie-dnsutils" => Some(Self::DnsUtils),
            "busybox" => Some(Self::Busybox),
            "httpd" => Some(Self::WebServer {
                root: "/usr/local/apache2/htdocs",
            }),
            "nginx" => Some(Self::WebServer {
                root: "/usr/share/nginx/html",
            }),
            "kitten" => Some(Self::UpdateDemo {
                picture: "kitten.jpg",
            }),
            "nautilus" => Some(Self::UpdateDemo {
                picture: "nautilus.jpg",
            }),
            _ => None,
        }
    }

    /// A word for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Agnhost => "agnhost with curl, dig, nc, ip",
            Self::DnsUtils => "the agnhost image: dig, nslookup, getent",
            Self::Busybox => "busybox, every applet in /bin, bash as sh on PATH",
            Self::Pause => "pause",
            Self::WebServer { .. } => "busybox httpd on :80",
            Self::UpdateDemo { .. } => "agnhost test-webserver with data.json",
        }
    }
}

/// A tool of agnhost's upstream image (Alpine's packages there), taken from this machine's Debian package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    /// Its file name on this machine, found in `PATH` and the system folders.
    pub on_host: &'static str,
    /// Where it goes in the image (as in the upstream image; the first match in the image's `PATH` ahead
    /// of a busybox applet of the same name).
    pub in_image: &'static str,
    /// The Debian package that has it.
    pub package: &'static str,
}

/// The tools agnhost's upstream image adds (`apk add bind-tools curl netcat-openbsd iproute2 iperf bash`,
/// and Alpine's `getent`), which the networking and DNS tests run in its pods.
pub const AGNHOST_TOOLS: &[Tool] = &[
    Tool {
        on_host: "curl",
        in_image: "/usr/bin/curl",
        package: "curl",
    },
    Tool {
        on_host: "dig",
        in_image: "/usr/bin/dig",
        package: "bind9-dnsutils",
    },
    Tool {
        on_host: "nslookup",
        in_image: "/usr/bin/nslookup",
        package: "bind9-dnsutils",
    },
    Tool {
        on_host: "host",
        in_image: "/usr/bin/host",
        package: "bind9-host",
    },
    Tool {
        on_host: "nc.openbsd",
        in_image: "/usr/bin/nc",
        package: "netcat-openbsd",
    },
    Tool {
        on_host: "ip",
        in_image: "/sbin/ip",
        package: "iproute2",
    },
    Tool {
        on_host: "ss",
        in_image: "/usr/sbin/ss",
        package: "iproute2",
    },
    Tool {
        on_host: "iperf",
        in_image: "/usr/bin/iperf",
        package: "iperf",
    },
    BASH,
    Tool {
        on_host: "getent",
        in_image: "/usr/bin/getent",
        package: "libc-bin",
    },
];

/// bash, in agnhost's image and as `sh` in busybox's.
pub const BASH: Tool = Tool {
    on_host: "bash",
    in_image: "/bin/bash",
    package: "bash",
};

/// The one `apt-get install` line for `tools` (each package once, in order).
pub fn apt_line(tools: &[&Tool]) -> String {
    let mut packages: Vec<&str> = Vec::new();
    for tool in tools {
        if !packages.contains(&tool.package) {
            packages.push(tool.package);
        }
    }
    format!("apt-get install {}", packages.join(" "))
}

/// The shared libraries (and the loader) that `ldd`'s output lists by path, and the names it found no file
/// for (`libfoo.so.1 => not found`); nothing for a static binary.
pub fn parse_ldd(text: &str) -> (Vec<PathBuf>, Vec<String>) {
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for line in text.lines().map(str::trim) {
        let (name, path) = match line.split_once("=>") {
            Some((name, rest)) => (name.trim(), rest.split_whitespace().next().unwrap_or_default()),
            None => ("", line.split_whitespace().next().unwrap_or_default()),
        };
        if path.starts_with('/') {
            found.push(PathBuf::from(path));
        } else if !name.is_empty() && path == "not" {
            missing.push(name.to_owned());
        }
    }
    (found, missing)
}

/// The files of `tools` for an image: each program where [`Tool::in_image`] says and every library it
/// links at its path on this machine, each destination once. A tool missing from this machine, or a
/// library `ldd` cannot find, is an error that names the packages to install.
pub fn tool_files(tools: &[Tool]) -> Result<Vec<(PathBuf, String)>> {
    let missing: Vec<&Tool> = tools.iter().filter(|t| find_tool(t.on_host).is_none()).collect();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|t| t.on_host).collect();
        return Err(Error::MissingPart {
            part: format!("{} for the agnhost image", names.join(", ")),
            hint: format!("install Debian's packages: {}", apt_line(&missing)),
        });
    }
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for tool in tools {
        let program = find_tool(tool.on_host).expect("found above");
        let ldd = find_tool("ldd").ok_or_else(|| Error::MissingPart {
            part: "ldd, to find the libraries of the agnhost image's tools".into(),
            hint: "install Debian's libc-bin".into(),
        })?;
        let output = Command::new(&ldd)
            .arg(&program)
            .output()
            .map_err(Error::io(format!("running ldd {}", program.display())))?;
        let (libraries, unresolved) = parse_ldd(&String::from_utf8_lossy(&output.stdout));
        if !unresolved.is_empty() {
            return Err(Error::MissingPart {
                part: format!("{} (linked by {})", unresolved.join(", "), program.display()),
                hint: format!("reinstall Debian's {}", tool.package),
            });
        }
        files.push((program, tool.in_image.to_owned()));
        files.extend(libraries.into_iter().map(|lib| {
            let destination = lib.display().to_string();
            (lib, destination)
        }));
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    files.dedup_by(|a, b| a.1 == b.1);
    Ok(files)
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
/// `test/images/agnhost`) with [`AGNHOST_TOOLS`] from this machine, the rest as [`Stand`] says.
pub fn serve_images(e2e_test: &Path, agnhost: &Path) -> Result<ServedImages> {
    if !agnhost.is_file() {
        return Err(Error::MissingPart {
            part: format!("agnhost at {}", agnhost.display()),
            hint: "build it from the Kubernetes source tree of e2e.test: go build ./test/images/agnhost"
                .into(),
        });
    }
    let tools = tool_files(AGNHOST_TOOLS)?;
    let bash = tool_files(&[BASH])?;
    let certificate = porter_certificate()?;
    let busybox = crate::realnodes::images::find_busybox()?;
    let mut report = ServedImages::default();
    let mut agnhost_names = Vec::new();
    for reference in list_images(e2e_test)? {
        let Some(stand) = Stand::of(&reference) else {
            report.missing.push(reference);
            continue;
        };
        match stand {
            // One image for every name of it: the tools' layer is large.
            Stand::Agnhost | Stand::DnsUtils => agnhost_names.push(reference.clone()),
            Stand::UpdateDemo { picture } => RealNodes::add_local_image(update_demo_image(
                &reference,
                agnhost,
                &tools,
                &certificate,
                picture,
            ))?,
            Stand::WebServer { root } => RealNodes::add_local_image(web_server_image(&reference, root))?,
            Stand::Busybox => RealNodes::add_local_image(busybox_image(&reference, &busybox, &bash)?)?,
            Stand::Pause => alias(PAUSE_IMAGE, &reference)?,
        }
        report.served.push((reference, stand));
    }
    if !agnhost_names.is_empty() {
        RealNodes::add_local_image(agnhost_image(&agnhost_names, agnhost, &tools, &certificate))?;
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

/// The TLS certificate and key agnhost's image carries at `/localhost.crt` and `/localhost.key` (porter's,
/// which the lifecycle-hook tests' handler pod serves HTTPS with): here a new one for `localhost`,
/// 127.0.0.1 and ::1, as upstream's names.
#[derive(Clone, Debug)]
pub struct PorterCertificate {
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM (PKCS#8) key.
    pub key_pem: String,
}

fn porter_certificate() -> Result<PorterCertificate> {
    let authority = CertificateAuthority::new("agnhost porter")?;
    let leaf = authority.issue(
        "localhost",
        &[],
        &["localhost", "127.0.0.1", "::1"],
        Usage::Server,
    )?;
    Ok(PorterCertificate {
        cert_pem: format!("{}{}", leaf.cert_pem, authority.cert_pem()),
        key_pem: leaf.key_pem,
    })
}

/// agnhost's upstream image: `/agnhost` and its `agnhost-2` link, `/uploads`, porter's certificate and
/// key, the user and group some tests run as by name, and the tools (`tools`, from [`tool_files`]) with
/// their libraries; `/etc/nsswitch.conf` so that `getent hosts` reads `/etc/hosts` before DNS, as musl's
/// does upstream; iperf also at `/usr/local/bin/iperf`, as upstream links it; `sh` is bash, so that shell
/// commands run the tools rather than busybox's applets of the same names.
pub fn agnhost_image(
    names: &[String],
    agnhost: &Path,
    tools: &[(PathBuf, String)],
    certificate: &PorterCertificate,
) -> LocalImage {
    let mut files = vec![(PathBuf::from(agnhost), "/agnhost".to_owned())];
    files.extend(tools.iter().cloned());
    let mut links = vec![("/agnhost-2".to_owned(), "/agnhost".to_owned())];
    if tools.iter().any(|(_, dest)| dest == "/usr/bin/iperf") {
        links.push(("/usr/local/bin/iperf".into(), "/usr/bin/iperf".into()));
    }
    // Debian's busybox `sh` runs its own applets before anything on PATH (it is built to prefer them), so
    // the tests' `sh -c 'nc -v …'` got busybox's `nc`, which has no `-v`; Alpine's, upstream, finds the
    // tools on PATH. bash finds them too.
    if tools.iter().any(|(_, dest)| dest == BASH.in_image) {
        links.push(("/bin/sh".into(), BASH.in_image.into()));
    }
    LocalImage {
        names: names.to_vec(),
        files,
        links,
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
            ("/etc/nsswitch.conf".into(), "hosts: files dns\n".into()),
            ("/localhost.crt".into(), certificate.cert_pem.clone()),
            ("/localhost.key".into(), certificate.key_pem.clone()),
        ],
        entrypoint: vec!["/agnhost".into()],
        cmd: vec!["pause".into()],
    }
}

/// The Update Demo's image (kitten, nautilus): the agnhost image with `/data.json` naming `picture`, running
/// `test-webserver`, which serves files from `/` on port 80. The picture itself is not there: the test
/// reads only the data.
pub fn update_demo_image(
    reference: &str,
    agnhost: &Path,
    tools: &[(PathBuf, String)],
    certificate: &PorterCertificate,
    picture: &str,
) -> LocalImage {
    let mut image = agnhost_image(&[reference.to_owned()], agnhost, tools, certificate);
    image.texts.push((
        "/data.json".into(),
        format!("{{\n  \"image\": \"{picture}\"\n}}\n"),
    ));
    image.cmd = vec!["test-webserver".into()];
    image
}

/// A web server answering on port 80 with `<root>/index.html` (upstream httpd's page), which the StatefulSet
/// tests move away and back to fail and pass a readiness probe: busybox `httpd` in the foreground, under a
/// shell that ends at once on SIGTERM, as httpd and nginx do (busybox as PID 1 would ignore it).
pub fn web_server_image(reference: &str, root: &str) -> LocalImage {
    LocalImage {
        names: vec![reference.to_owned()],
        texts: vec![(
            format!("{root}/index.html"),
            "<html><body><h1>It works!</h1></body></html>\n".into(),
        )],
        cmd: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("trap 'exit 0' TERM; /bin/busybox httpd -f -p 80 -h {root} & wait"),
        ],
        ..LocalImage::default()
    }
}

/// The upstream busybox image's layout over the nodes' busybox layer: every applet also in `/bin` (tests
/// run `/bin/sysctl`, which Debian puts in `/sbin`). The upstream image's `sh` does two things Debian's
/// busybox `sh` does not do both of: it keeps environment variables whose names are not shell names
/// (`data-1`, which the ConfigMap and Secret tests read through `sh -c env`; Debian's drops them, bash keeps
/// them), and it says `/bin/sh: can't create /file: …` (the read-only root file system test runs
/// `/bin/sh -c 'echo test > /file'` and compares that line; bash words it otherwise). So `sh` found on
/// PATH is bash (`/usr/bin/sh`, before `/bin`; `bash`: [`BASH`]'s files from [`tool_files`]) and `/bin/sh`
/// named by its path is busybox. Its command is upstream's, `sh`.
pub fn busybox_image(reference: &str, busybox: &Path, bash: &[(PathBuf, String)]) -> Result<LocalImage> {
    let output = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(Error::io("listing busybox applets"))?;
    Ok(LocalImage {
        names: vec![reference.to_owned()],
        files: bash.to_vec(),
        links: busybox_links(&String::from_utf8_lossy(&output.stdout)),
        // Upstream's command: a test container that names neither command nor args runs `sh`, which ends
        // at once (a Job test's pods do; without it containerd refuses them, "no command specified").
        cmd: vec!["sh".into()],
        ..LocalImage::default()
    })
}

/// `/bin/<applet>` for every applet of `busybox --list` (but busybox itself and bash), and `sh` on PATH
/// (`/usr/bin/sh`) being bash: see [`busybox_image`].
pub fn busybox_links(applets: &str) -> Vec<(String, String)> {
    let mut links: Vec<(String, String)> = applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && *a != "bash")
        .map(|a| (format!("/bin/{a}"), "/bin/busybox".to_owned()))
        .collect();
    links.push(("/usr/bin/sh".into(), "/bin/bash".into()));
    links.sort();
    links.dedup();
    links
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
        let httpd = Stand::WebServer {
            root: "/usr/local/apache2/htdocs",
        };
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
            ("registry.k8s.io/e2e-test-images/httpd:2.4.38-4", Some(httpd)),
            ("registry.k8s.io/e2e-test-images/httpd:2.4.39-4", Some(httpd)),
            (
                "registry.k8s.io/e2e-test-images/nginx:1.14-4",
                Some(Stand::WebServer {
                    root: "/usr/share/nginx/html",
                }),
            ),
            (
                "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7",
                Some(Stand::DnsUtils),
            ),
            (
                "registry.k8s.io/e2e-test-images/kitten:1.7",
                Some(Stand::UpdateDemo {
                    picture: "kitten.jpg",
                }),
            ),
            (
                "registry.k8s.io/e2e-test-images/nautilus:1.7",
                Some(Stand::UpdateDemo {
                    picture: "nautilus.jpg",
                }),
            ),
            ("registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2", None),
            ("registry.k8s.io/e2e-test-images/nonewprivs:1.3", None),
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

    fn certificate() -> PorterCertificate {
        PorterCertificate {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        }
    }

    fn text<'a>(image: &'a LocalImage, path: &str) -> Option<&'a str> {
        image
            .texts
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, t)| t.as_str())
    }

    #[test]
    fn agnhost_runs_as_upstream_with_its_tools_and_porters_certificate() {
        let tools = vec![
            (PathBuf::from("/usr/bin/curl"), "/usr/bin/curl".to_owned()),
            (PathBuf::from("/usr/bin/iperf"), "/usr/bin/iperf".to_owned()),
            (PathBuf::from("/bin/bash"), "/bin/bash".to_owned()),
            (
                PathBuf::from("/lib/x86_64-linux-gnu/libcurl.so.4"),
                "/lib/x86_64-linux-gnu/libcurl.so.4".to_owned(),
            ),
        ];
        let names = ["r/agnhost:1".to_owned(), "r/jessie-dnsutils:1".to_owned()];
        let image = agnhost_image(&names, Path::new("/tmp/agnhost"), &tools, &certificate());
        assert_eq!(image.names, names, "one image for both names");
        assert_eq!(image.entrypoint, vec!["/agnhost"]);
        assert_eq!(image.cmd, vec!["pause"]);
        assert!(text(&image, "/etc/passwd").is_some_and(|t| t.contains(":1000:")));
        assert_eq!(text(&image, "/localhost.crt"), Some("CERT"));
        assert_eq!(text(&image, "/localhost.key"), Some("KEY"));
        assert_eq!(text(&image, "/etc/nsswitch.conf"), Some("hosts: files dns\n"));
        for (_, destination) in &tools {
            assert!(image.files.iter().any(|(_, d)| d == destination), "{destination}");
        }
        assert!(
            image
                .links
                .contains(&("/usr/local/bin/iperf".to_owned(), "/usr/bin/iperf".to_owned()))
        );
        assert!(
            image
                .links
                .contains(&("/agnhost-2".to_owned(), "/agnhost".to_owned()))
        );
        assert!(
            image
                .links
                .contains(&("/bin/sh".to_owned(), "/bin/bash".to_owned())),
            "sh -c runs the tools on PATH, not busybox's applets"
        );
    }

    #[test]
    fn the_update_demo_serves_its_data_from_agnhost_test_webserver() {
        let image = update_demo_image(
            "r/kitten:1.7",
            Path::new("/tmp/agnhost"),
            &[],
            &certificate(),
            "kitten.jpg",
        );
        assert_eq!(image.cmd, vec!["test-webserver"]);
        let data: serde_json::Value =
            serde_json::from_str(text(&image, "/data.json").expect("data.json")).expect("JSON");
        assert_eq!(data, serde_json::json!({"image": "kitten.jpg"}));
    }

    #[test]
    fn a_web_server_serves_index_html_from_its_upstream_root_and_stops_on_sigterm() {
        let image = web_server_image("r/httpd:1", "/usr/local/apache2/htdocs");
        assert!(
            text(&image, "/usr/local/apache2/htdocs/index.html").is_some_and(|t| t.contains("It works!"))
        );
        let script = image.cmd.last().expect("script");
        assert!(
            script.contains("httpd -f -p 80 -h /usr/local/apache2/htdocs"),
            "{script}"
        );
        assert!(script.starts_with("trap 'exit 0' TERM;"), "{script}");
        assert!(image.entrypoint.is_empty(), "a test's command replaces the shell");
    }

    #[test]
    fn busybox_runs_sh_for_a_container_that_names_no_command() {
        // `echo --list` stands in for busybox's list of applets.
        let image = busybox_image(
            "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
            std::path::Path::new("/bin/echo"),
            &[],
        )
        .expect("image");
        assert_eq!(image.cmd, vec!["sh"]);
        assert!(image.entrypoint.is_empty(), "a test's command replaces it");
    }

    #[test]
    fn busybox_puts_every_applet_in_bin_and_sh_on_path_is_bash() {
        let links = busybox_links("sh\nsysctl\nbusybox\nenv\n\nenv\n");
        assert_eq!(
            links,
            vec![
                ("/bin/env".to_owned(), "/bin/busybox".to_owned()),
                ("/bin/sh".to_owned(), "/bin/busybox".to_owned()),
                ("/bin/sysctl".to_owned(), "/bin/busybox".to_owned()),
                ("/usr/bin/sh".to_owned(), "/bin/bash".to_owned()),
            ]
        );
    }

    #[test]
    fn ldd_output_gives_the_libraries_by_path_and_the_ones_not_found() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007f26)\n\
                    \tlibgone.so.2 => not found\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f26)\n";
        let (found, missing) = parse_ldd(text);
        assert_eq!(
            found,
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libcurl.so.4"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert_eq!(missing, vec!["libgone.so.2".to_owned()]);
        // A static binary: nothing.
        assert_eq!(parse_ldd("\tstatically linked\n"), (vec![], vec![]));
        assert_eq!(parse_ldd("\tnot a dynamic executable\n"), (vec![], vec![]));
    }

    #[test]
    fn the_apt_line_names_each_package_of_the_missing_tools_once() {
        let missing: Vec<&Tool> = AGNHOST_TOOLS
            .iter()
            .filter(|t| ["dig", "nslookup", "nc.openbsd"].contains(&t.on_host))
            .collect();
        assert_eq!(
            apt_line(&missing),
            "apt-get install bind9-dnsutils netcat-openbsd"
        );
    }

    /// On this machine, when the packages are installed: every tool is found with libraries that exist.
    #[test]
    fn the_tools_files_exist_on_a_machine_that_has_them() {
        match tool_files(AGNHOST_TOOLS) {
            Ok(files) => {
                assert!(files.iter().any(|(_, d)| d == "/usr/bin/curl"));
                assert!(files.iter().any(|(_, d)| d.ends_with("/libc.so.6")), "{files:?}");
                for (source, _) in &files {
                    assert!(source.is_file(), "{}", source.display());
                }
            }
            Err(Error::MissingPart { part, hint }) => {
                assert!(
                    hint.starts_with("install Debian's packages: apt-get install "),
                    "{hint}"
                );
                eprintln!("skipped: {part} missing ({hint})");
            }
            Err(other) => panic!("{other}"),
        }
    }
}
