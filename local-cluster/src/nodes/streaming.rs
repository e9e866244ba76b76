//! The simulated kubelet's streaming endpoints: `exec`, `attach` and `portForward`, over SPDY/3.1 (what
//! kubectl and kube-apiserver v1.26 speak to kubelets) and over WebSocket (`v4`/`v5.channel.k8s.io`, what
//! kube-rs speaks).
//!
//! Everything is deterministic, so tests know what to expect:
//!
//! - exec runs pretend commands: `echo <args>` prints its arguments; `cat` echoes stdin until it closes;
//!   `tty` prints whether a terminal was requested and the first terminal size received
//!   (`tty=true size=80x24`); `whoami` prints `<namespace>/<pod>/<container>`; `stderr <args>` prints to
//!   stderr; `exit <n>` ends with exit code `n`; `sleep <seconds>`; anything else prints
//!   `<cmd>: command not found` to stderr and exits with 127.
//! - attach prints `attached to <namespace>/<pod>/<container>`, then echoes stdin until it closes.
//! - port-forward answers every connection to port `p` with the line `<namespace>/<pod>:<p>`, then
//!   echoes what it receives until the client closes.
//!
//! The SPDY side implements what Kubernetes' spdystream needs: SYN_STREAM/SYN_REPLY with zlib-compressed
//! header blocks (the SPDY/3 dictionary), DATA with FIN, RST_STREAM, PING, GOAWAY; SETTINGS, HEADERS and
//! WINDOW_UPDATE are read and ignored (spdystream does no flow control).

use std::{collections::HashMap, io, sync::Arc, sync::LazyLock, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::{Path, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::{Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::{Mutex, mpsc},
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{Message, handshake::derive_accept_key, protocol::Role},
};

/// How the kubelet API checks that a pod (and container, and uid) runs on its nodes.
pub(crate) trait PodCheck: Clone + Send + Sync + 'static {
    /// `Err((status, message))` when the pod, uid or container is not here.
    fn check(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        container: Option<&str>,
    ) -> Result<(), (StatusCode, String)>;
}

/// The streaming routes, for [`super::kubelet`]'s router.
pub(crate) fn routes<S: PodCheck>() -> Router<S> {
    Router::new()
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec::<S>).post(exec::<S>),
        )
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec_with_uid::<S>).post(exec_with_uid::<S>),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach::<S>).post(attach::<S>),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(attach_with_uid::<S>).post(attach_with_uid::<S>),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward::<S>).post(port_forward::<S>),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(port_forward_with_uid::<S>).post(port_forward_with_uid::<S>),
        )
}

/// What a streaming request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Exec(Vec<String>),
    Attach,
    PortForward,
}

/// Which streams the client wants (the kubelet's `input`, `output`, `error`, `tty` flags, set by `1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StreamOptions {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

struct Session {
    kind: Kind,
    /// `<namespace>/<pod>/<container>` or `<namespace>/<pod>`.
    target: String,
    options: StreamOptions,
    /// Ports of a WebSocket port-forward (from the query).
    ports: Vec<u16>,
}

fn query_pairs(request: &Request) -> Vec<(String, String)> {
    form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

async fn exec<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    start(pods, &namespace, &pod, None, Some(&container), true, request)
}

async fn exec_with_uid<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    start(
        pods,
        &namespace,
        &pod,
        Some(&uid),
        Some(&container),
        true,
        request,
    )
}

async fn attach<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    start(pods, &namespace, &pod, None, Some(&container), false, request)
}

async fn attach_with_uid<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    start(
        pods,
        &namespace,
        &pod,
        Some(&uid),
        Some(&container),
        false,
        request,
    )
}

async fn port_forward<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    start(pods, &namespace, &pod, None, None, false, request)
}

async fn port_forward_with_uid<S: PodCheck>(
    State(pods): State<S>,
    Path((namespace, pod, uid)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    start(pods, &namespace, &pod, Some(&uid), None, false, request)
}

fn start<S: PodCheck>(
    pods: S,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    container: Option<&str>,
    is_exec: bool,
    request: Request,
) -> Response {
    if let Err(refusal) = pods.check(namespace, pod, uid, container) {
        return refusal.into_response();
    }
    let pairs = query_pairs(&request);
    let flag = |name: &str| pairs.iter().any(|(k, v)| k == name && v == "1");
    let kind = match (container, is_exec) {
        (None, _) => Kind::PortForward,
        (Some(_), true) => Kind::Exec(
            pairs
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect(),
        ),
        (Some(_), false) => Kind::Attach,
    };
    let mut options = StreamOptions {
        stdin: flag("input"),
        stdout: flag("output"),
        stderr: flag("error"),
        tty: flag("tty"),
    };
    // As the kubelet: a terminal has no separate stderr.
    if options.tty {
        options.stderr = false;
    }
    if kind != Kind::PortForward && !(options.stdin || options.stdout || options.stderr) {
        return (
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr\n",
        )
            .into_response();
    }
    let ports = pairs
        .iter()
        .filter(|(k, _)| k == "port")
        .flat_map(|(_, v)| v.split(',').map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    let target = match container {
        Some(container) => format!("{namespace}/{pod}/{container}"),
        None => format!("{namespace}/{pod}"),
    };
    let session = Session {
        kind,
        target,
        options,
        ports,
    };
    if is_websocket(request.headers()) {
        websocket_upgrade(request, session)
    } else if is_spdy(request.headers()) {
        spdy_upgrade(request, session)
    } else {
        (
            StatusCode::BAD_REQUEST,
            "streaming needs an upgrade to SPDY/3.1 or websocket\n",
        )
            .into_response()
    }
}

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

fn is_websocket(headers: &HeaderMap) -> bool {
    header_values(headers, "upgrade")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("websocket"))
}

fn is_spdy(headers: &HeaderMap) -> bool {
    header_values(headers, "upgrade")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("SPDY/3.1"))
}

/// Remote-command protocols the simulated kubelet speaks over SPDY, preferred first.
const SPDY_EXEC_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"];
const SPDY_PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

fn spdy_upgrade(mut request: Request, session: Session) -> Response {
    let offered = header_values(request.headers(), "x-stream-protocol-version");
    let supported: &[&str] = match session.kind {
        Kind::PortForward => &[SPDY_PORT_FORWARD_PROTOCOL],
        _ => SPDY_EXEC_PROTOCOLS,
    };
    // As apimachinery's handshake: the client's first protocol the server supports.
    let Some(protocol) = offered.iter().find(|p| supported.contains(&p.as_str())).cloned() else {
        return (
            StatusCode::FORBIDDEN,
            format!("unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {supported:?}\n"),
        )
            .into_response();
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let negotiated = protocol.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => serve_spdy(TokioIo::new(upgraded), &negotiated, session).await,
            Err(error) => tracing::debug!(%error, "SPDY upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(value) = HeaderValue::from_str(&protocol) {
        headers.insert("x-stream-protocol-version", value);
    }
    response
}

/// WebSocket sub-protocols, preferred first.
const WEBSOCKET_EXEC_PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"];
const WEBSOCKET_PORT_FORWARD_PROTOCOLS: &[&str] =
    &["portforward.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"];

fn websocket_upgrade(mut request: Request, session: Session) -> Response {
    let Some(key) = request.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return (StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key\n").into_response();
    };
    let offered = header_values(request.headers(), "sec-websocket-protocol");
    let supported = match session.kind {
        Kind::PortForward => WEBSOCKET_PORT_FORWARD_PROTOCOLS,
        _ => WEBSOCKET_EXEC_PROTOCOLS,
    };
    let protocol = supported
        .iter()
        .find(|p| offered.iter().any(|o| o == *p))
        .map(|p| (*p).to_owned());
    if protocol.is_none() && !offered.is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            format!("none of the sub-protocols {offered:?} is supported\n"),
        )
            .into_response();
    }
    if session.kind == Kind::PortForward && session.ports.is_empty() {
        return (StatusCode::BAD_REQUEST, "query parameter \"port\" is required\n").into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    let negotiated = protocol.clone().unwrap_or_else(|| "channel.k8s.io".to_owned());
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
                serve_websocket(socket, &negotiated, session).await;
            }
            Err(error) => tracing::debug!(%error, "WebSocket upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Some(value) = protocol.and_then(|p| HeaderValue::from_str(&p).ok()) {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    response
}

// ---------------------------------------------------------------------------------------------------
// The pretend processes, shared by both transports.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Stdout,
    Stderr,
}

/// What a process sees: stdin and terminal resizes coming in, output going out.
struct ProcessIo {
    stdin: Option<mpsc::UnboundedReceiver<Bytes>>,
    resize: Option<mpsc::UnboundedReceiver<Bytes>>,
    output: mpsc::UnboundedSender<(Output, Bytes)>,
}

impl ProcessIo {
    fn print(&self, to: Output, text: impl Into<String>) {
        let _ = self.output.send((to, Bytes::from(text.into())));
    }

    async fn echo_stdin(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            while let Some(chunk) = stdin.recv().await {
                let _ = self.output.send((Output::Stdout, chunk));
            }
        }
    }
}

/// Runs the pretend process; returns its exit code.
async fn run_process(kind: &Kind, target: &str, tty: bool, mut io: ProcessIo) -> i32 {
    match kind {
        Kind::PortForward => 0,
        Kind::Attach => {
            io.print(Output::Stdout, format!("attached to {target}\n"));
            io.echo_stdin().await;
            0
        }
        Kind::Exec(command) => {
            let args = command.get(1..).unwrap_or_default().join(" ");
            match command.first().map(String::as_str) {
                Some("echo") => {
                    io.print(Output::Stdout, format!("{args}\n"));
                    0
                }
                Some("cat") => {
                    io.echo_stdin().await;
                    0
                }
                Some("whoami") => {
                    io.print(Output::Stdout, format!("{target}\n"));
                    0
                }
                Some("tty") => {
                    let mut size = "none".to_owned();
                    // kubectl sends the terminal's size just after the stream opens, but on a loaded CI
                    // machine that may come seconds later: wait as long as kubectl itself would.
                    if let Some(resize) = io.resize.as_mut()
                        && let Ok(Some(event)) =
                            tokio::time::timeout(Duration::from_secs(30), resize.recv()).await
                        && let Ok(event) = serde_json::from_slice::<serde_json::Value>(&event)
                    {
                        size = format!("{}x{}", event["Width"], event["Height"]);
                    }
                    io.print(Output::Stdout, format!("tty={tty} size={size}\n"));
                    0
                }
                Some("stderr") => {
                    io.print(Output::Stderr, format!("{args}\n"));
                    0
                }
                Some("exit") => command.get(1).and_then(|c| c.parse().ok()).unwrap_or(1),
                Some("sleep") => {
                    let seconds: f64 = command.get(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
                    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                    0
                }
                Some(other) => {
                    io.print(Output::Stderr, format!("{other}: command not found\n"));
                    127
                }
                None => {
                    io.print(Output::Stderr, "no command\n");
                    1
                }
            }
        }
    }
}

/// The `metav1.Status` a v4 client expects on the error stream.
fn exit_status_json(code: i32) -> String {
    match code {
        0 => serde_json::json!({"metadata": {}, "status": "Success"}).to_string(),
        code => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        })
        .to_string(),
    }
}

// ---------------------------------------------------------------------------------------------------
// SPDY/3.1 framing.

const FLAG_FIN: u8 = 0x01;
const SPDY_VERSION: u32 = 3;
const TYPE_SYN_STREAM: u32 = 1;
const TYPE_SYN_REPLY: u32 = 2;
const TYPE_RST_STREAM: u32 = 3;
const TYPE_PING: u32 = 6;
const TYPE_GOAWAY: u32 = 7;
const TYPE_HEADERS: u32 = 8;
/// Largest DATA payload written at once.
const MAX_DATA_CHUNK: usize = 32 * 1024;

/// The SPDY/3 header-compression dictionary (spec section 2.6.10.1): length-prefixed header names and
/// common values, then a run of common status lines, dates and content types.
pub(crate) static SPDY3_DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
        "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
        "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
        "503 Service Unavailable",
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
        "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
        "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
        "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut dictionary = Vec::with_capacity(1423);
    for word in WORDS {
        dictionary.extend_from_slice(&(word.len() as u32).to_be_bytes());
        dictionary.extend_from_slice(word.as_bytes());
    }
    dictionary.extend_from_slice(TAIL.as_bytes());
    dictionary
});

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// One direction's header compression: a single zlib stream over the connection, with the dictionary.
struct HeaderDeflater(Compress);

impl HeaderDeflater {
    fn new() -> io::Result<Self> {
        let mut compress = Compress::new(Compression::default(), true);
        compress
            .set_dictionary(&SPDY3_DICTIONARY)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self(compress))
    }

    fn deflate(&mut self, block: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut consumed = 0;
        loop {
            let before = self.0.total_in();
            self.0
                .compress_vec(&block[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| invalid(e.to_string()))?;
            consumed += (self.0.total_in() - before) as usize;
            if consumed >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            out.reserve(out.capacity().max(64));
        }
    }
}

/// The other direction: inflates header blocks, supplying the dictionary when zlib asks for it.
struct HeaderInflater(Decompress);

impl HeaderInflater {
    fn new() -> Self {
        Self(Decompress::new(true))
    }

    fn inflate(&mut self, input: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() * 4 + 256);
        let mut consumed = 0;
        loop {
            let (before_in, before_out) = (self.0.total_in(), self.0.total_out());
            let result = self
                .0
                .decompress_vec(&input[consumed..], &mut out, FlushDecompress::Sync);
            consumed += (self.0.total_in() - before_in) as usize;
            let progressed = self.0.total_in() != before_in || self.0.total_out() != before_out;
            match result {
                Ok(_) => {}
                Err(error) if error.needs_dictionary().is_some() => {
                    self.0
                        .set_dictionary(&SPDY3_DICTIONARY)
                        .map_err(|e| invalid(e.to_string()))?;
                    continue;
                }
                Err(error) => return Err(invalid(format!("header block: {error}"))),
            }
            if consumed >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if out.len() == out.capacity() {
                out.reserve(out.capacity());
            } else if !progressed {
                return Err(invalid("header block does not inflate"));
            }
        }
    }
}

type Headers = Vec<(String, String)>;

fn encode_header_block(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        block.extend_from_slice(&(name.len() as u32).to_be_bytes());
        block.extend_from_slice(name.to_ascii_lowercase().as_bytes());
        block.extend_from_slice(&(value.len() as u32).to_be_bytes());
        block.extend_from_slice(value.as_bytes());
    }
    block
}

fn decode_header_block(block: &[u8]) -> io::Result<Headers> {
    let mut rest = block;
    let mut take = |n: usize| -> io::Result<&[u8]> {
        if rest.len() < n {
            return Err(invalid("short header block"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = be32(take(4)?);
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name_len = be32(take(4)?);
        let name = String::from_utf8_lossy(take(name_len)?).to_ascii_lowercase();
        let value_len = be32(take(4)?);
        let value = String::from_utf8_lossy(take(value_len)?).into_owned();
        for part in value.split('\0') {
            headers.push((name.clone(), part.to_owned()));
        }
    }
    Ok(headers)
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[derive(Debug, PartialEq)]
enum Frame {
    SynStream {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    RstStream {
        stream_id: u32,
    },
    Ping {
        id: u32,
    },
    GoAway,
    /// SYN_REPLY, HEADERS, SETTINGS, WINDOW_UPDATE and unknown types.
    Ignored,
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Reads one frame; `None` at the end of the connection.
async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
    inflater: &mut HeaderInflater,
) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match reader.read_exact(&mut head).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let first = be32(&head[0..4]);
    let flags = head[4];
    let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).await?;
    if first & 0x8000_0000 == 0 {
        return Ok(Some(Frame::Data {
            stream_id: first & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::from(payload),
        }));
    }
    let need = |n: usize| match payload.len() >= n {
        true => Ok(()),
        false => Err(invalid("short control frame")),
    };
    Ok(Some(match first & 0xffff {
        TYPE_SYN_STREAM => {
            need(10)?;
            Frame::SynStream {
                stream_id: be32(&payload[0..4]) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                headers: decode_header_block(&inflater.inflate(&payload[10..])?)?,
            }
        }
        TYPE_SYN_REPLY | TYPE_HEADERS => {
            // Inflated only to keep the shared zlib stream in step.
            need(4)?;
            inflater.inflate(&payload[4..])?;
            Frame::Ignored
        }
        TYPE_RST_STREAM => {
            need(8)?;
            Frame::RstStream {
                stream_id: be32(&payload[0..4]) & 0x7fff_ffff,
            }
        }
        TYPE_PING => {
            need(4)?;
            Frame::Ping {
                id: be32(&payload[0..4]),
            }
        }
        TYPE_GOAWAY => Frame::GoAway,
        _ => Frame::Ignored,
    }))
}

fn control_header(kind: u32, flags: u8, length: usize) -> [u8; 8] {
    let mut head = [0u8; 8];
    head[0..4].copy_from_slice(&(0x8000_0000 | (SPDY_VERSION << 16) | kind).to_be_bytes());
    head[4..8].copy_from_slice(&((u32::from(flags) << 24) | length as u32).to_be_bytes());
    head
}

/// The writing half of a SPDY connection; frames are written whole and flushed.
struct SpdyWriter<W> {
    io: W,
    deflater: HeaderDeflater,
}

impl<W: AsyncWrite + Unpin> SpdyWriter<W> {
    async fn frame(&mut self, head: [u8; 8], payload: &[u8]) -> io::Result<()> {
        let mut buffer = BytesMut::with_capacity(8 + payload.len());
        buffer.extend_from_slice(&head);
        buffer.extend_from_slice(payload);
        self.io.write_all(&buffer).await?;
        self.io.flush().await
    }

    async fn syn_reply(&mut self, stream_id: u32) -> io::Result<()> {
        let block = self.deflater.deflate(&encode_header_block(&[]))?;
        let mut payload = stream_id.to_be_bytes().to_vec();
        payload.extend_from_slice(&block);
        self.frame(control_header(TYPE_SYN_REPLY, 0, payload.len()), &payload)
            .await
    }

    async fn data(&mut self, stream_id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut chunks: Vec<&[u8]> = data.chunks(MAX_DATA_CHUNK).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let flags = if fin && i == last { FLAG_FIN } else { 0 };
            let mut head = [0u8; 8];
            head[0..4].copy_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
            head[4..8].copy_from_slice(&((u32::from(flags) << 24) | chunk.len() as u32).to_be_bytes());
            self.frame(head, chunk).await?;
        }
        Ok(())
    }

    async fn ping(&mut self, id: u32) -> io::Result<()> {
        self.frame(control_header(TYPE_PING, 0, 4), &id.to_be_bytes())
            .await
    }

    async fn goaway(&mut self, last_stream: u32) -> io::Result<()> {
        let mut payload = last_stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_be_bytes());
        self.frame(control_header(TYPE_GOAWAY, 0, 8), &payload).await
    }
}

type SharedWriter<W> = Arc<Mutex<SpdyWriter<W>>>;

/// A stream the client opened.
struct ClientStream {
    id: u32,
    headers: Headers,
    /// Its DATA; closed at FIN, RST or the end of the connection.
    inbound: mpsc::UnboundedReceiver<Bytes>,
}

/// Reads frames, answers SYN_STREAM and PING, hands new streams to the session; ends at GOAWAY or EOF.
async fn read_frames<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    writer: SharedWriter<W>,
    new_streams: mpsc::UnboundedSender<ClientStream>,
    highest: Arc<std::sync::atomic::AtomicU32>,
) {
    let mut inflater = HeaderInflater::new();
    let mut inbound: HashMap<u32, mpsc::UnboundedSender<Bytes>> = HashMap::new();
    loop {
        let frame = match read_frame(&mut reader, &mut inflater).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "SPDY read");
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id,
                fin,
                headers,
            } => {
                highest.fetch_max(stream_id, std::sync::atomic::Ordering::Relaxed);
                if writer.lock().await.syn_reply(stream_id).await.is_err() {
                    break;
                }
                let (tx, rx) = mpsc::unbounded_channel();
                if !fin {
                    inbound.insert(stream_id, tx);
                }
                let _ = new_streams.send(ClientStream {
                    id: stream_id,
                    headers,
                    inbound: rx,
                });
            }
            Frame::Data { stream_id, fin, data } => {
                if let Some(tx) = inbound.get(&stream_id)
                    && !data.is_empty()
                {
                    let _ = tx.send(data);
                }
                if fin {
                    inbound.remove(&stream_id);
                }
            }
            Frame::RstStream { stream_id } => {
                inbound.remove(&stream_id);
            }
            Frame::Ping { id } => {
                // Answer the client's pings (odd ids); the server sends none of its own.
                if id % 2 == 1 && writer.lock().await.ping(id).await.is_err() {
                    break;
                }
            }
            Frame::GoAway => break,
            Frame::Ignored => {}
        }
    }
}

async fn serve_spdy<IO: AsyncRead + AsyncWrite + Send + 'static>(io: IO, protocol: &str, session: Session) {
    let (reader, write_half) = tokio::io::split(io);
    let deflater = match HeaderDeflater::new() {
        Ok(deflater) => deflater,
        Err(error) => {
            tracing::warn!(%error, "SPDY header compression");
            return;
        }
    };
    let writer = Arc::new(Mutex::new(SpdyWriter {
        io: write_half,
        deflater,
    }));
    let (new_streams_tx, new_streams) = mpsc::unbounded_channel();
    let highest = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let reading = tokio::spawn(read_frames(
        reader,
        writer.clone(),
        new_streams_tx,
        highest.clone(),
    ));
    match session.kind {
        Kind::PortForward => spdy_port_forward(&writer, new_streams, &session.target).await,
        _ => spdy_process(&writer, new_streams, protocol, &session).await,
    }
    // Done: say so, and close the connection.
    let mut writer = writer.lock().await;
    let _ = writer
        .goaway(highest.load(std::sync::atomic::Ordering::Relaxed))
        .await;
    let _ = writer.io.shutdown().await;
    reading.abort();
}

async fn spdy_process<W: AsyncWrite + Unpin + Send + 'static>(
    writer: &SharedWriter<W>,
    mut new_streams: mpsc::UnboundedReceiver<ClientStream>,
    protocol: &str,
    session: &Session,
) {
    let options = session.options;
    let resizable = options.tty && protocol != "v2.channel.k8s.io";
    let expected = 1
        + usize::from(options.stdin)
        + usize::from(options.stdout)
        + usize::from(options.stderr)
        + usize::from(resizable);
    let mut streams: HashMap<String, ClientStream> = HashMap::new();
    let collect = async {
        while streams.len() < expected {
            let Some(stream) = new_streams.recv().await else {
                return false;
            };
            let kind = header(&stream.headers, "streamtype").unwrap_or("").to_owned();
            streams.insert(kind, stream);
        }
        true
    };
    match tokio::time::timeout(Duration::from_secs(30), collect).await {
        Ok(true) => {}
        _ => {
            tracing::debug!("client did not create the expected streams");
            return;
        }
    }
    let id = |name: &str| streams.get(name).map(|s| s.id);
    let (error_id, stdout_id, stderr_id) = (id("error"), id("stdout"), id("stderr"));
    let (stdin_id, resize_id) = (id("stdin"), id("resize"));
    let stdin = streams.remove("stdin").map(|s| s.inbound);
    let resize = streams.remove("resize").map(|s| s.inbound);

    let (output_tx, mut output) = mpsc::unbounded_channel();
    let io = ProcessIo {
        stdin,
        resize,
        output: output_tx,
    };
    let pump = async {
        while let Some((to, bytes)) = output.recv().await {
            let target = match to {
                Output::Stderr => stderr_id.or(stdout_id),
                Output::Stdout => stdout_id,
            };
            if let Some(id) = target
                && writer.lock().await.data(id, &bytes, false).await.is_err()
            {
                return;
            }
        }
    };
    let (code, ()) = tokio::join!(run_process(&session.kind, &session.target, options.tty, io), pump);

    let mut writer = writer.lock().await;
    for id in [stdout_id, stderr_id].into_iter().flatten() {
        let _ = writer.data(id, &[], true).await;
    }
    if let Some(id) = error_id {
        let status = match protocol {
            "v4.channel.k8s.io" => exit_status_json(code),
            // v2 and v3 carry plain text, and only on failure.
            _ if code != 0 => format!("command terminated with non-zero exit code: exit status {code}"),
            _ => String::new(),
        };
        let _ = writer.data(id, status.as_bytes(), true).await;
    }
    // The process no longer reads: ending these lets the client's stdin copy finish.
    for id in [stdin_id, resize_id].into_iter().flatten() {
        let _ = writer.data(id, &[], true).await;
    }
}

async fn spdy_port_forward<W: AsyncWrite + Unpin + Send + 'static>(
    writer: &SharedWriter<W>,
    mut new_streams: mpsc::UnboundedReceiver<ClientStream>,
    target: &str,
) {
    // Streams come in pairs (error, data) with the same request id.
    let mut pending: HashMap<String, (Option<ClientStream>, Option<ClientStream>)> = HashMap::new();
    let mut connections = tokio::task::JoinSet::new();
    while let Some(stream) = new_streams.recv().await {
        let request = header(&stream.headers, "requestid").unwrap_or("").to_owned();
        let entry = pending.entry(request.clone()).or_default();
        match header(&stream.headers, "streamtype") {
            Some("error") => entry.0 = Some(stream),
            Some("data") => entry.1 = Some(stream),
            _ => continue,
        }
        if let (Some(_), Some(_)) = entry
            && let Some((Some(error), Some(data))) = pending.remove(&request)
        {
            let port = header(&data.headers, "port").unwrap_or("0").to_owned();
            let writer = writer.clone();
            let banner = format!("{target}:{port}\n");
            connections.spawn(async move {
                let mut data = data;
                if writer
                    .lock()
                    .await
                    .data(data.id, banner.as_bytes(), false)
                    .await
                    .is_err()
                {
                    return;
                }
                while let Some(bytes) = data.inbound.recv().await {
                    if writer.lock().await.data(data.id, &bytes, false).await.is_err() {
                        return;
                    }
                }
                let mut writer = writer.lock().await;
                let _ = writer.data(data.id, &[], true).await;
                let _ = writer.data(error.id, &[], true).await;
            });
        }
    }
    while connections.join_next().await.is_some() {}
}

// ---------------------------------------------------------------------------------------------------
// WebSocket channels.

const CHANNEL_STDIN: u8 = 0;
const CHANNEL_STDOUT: u8 = 1;
const CHANNEL_STDERR: u8 = 2;
const CHANNEL_ERROR: u8 = 3;
const CHANNEL_RESIZE: u8 = 4;
/// v5: the client closed the channel in the next byte.
const CHANNEL_CLOSE: u8 = 255;

fn channel_message(channel: u8, payload: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(payload.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(payload);
    Message::Binary(bytes.into())
}

async fn serve_websocket<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    socket: WebSocketStream<IO>,
    protocol: &str,
    session: Session,
) {
    match session.kind {
        Kind::PortForward => websocket_port_forward(socket, &session).await,
        _ => websocket_process(socket, protocol, &session).await,
    }
}

async fn websocket_process<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    socket: WebSocketStream<IO>,
    protocol: &str,
    session: &Session,
) {
    let (mut sink, mut incoming) = socket.split();
    let (stdin_tx, stdin) = mpsc::unbounded_channel();
    let (resize_tx, resize) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some(Ok(message)) = incoming.next().await {
            match message {
                Message::Binary(bytes) if !bytes.is_empty() => match bytes[0] {
                    CHANNEL_STDIN => {
                        if let Some(tx) = &stdin_tx {
                            let _ = tx.send(bytes.slice(1..));
                        }
                    }
                    CHANNEL_RESIZE => {
                        let _ = resize_tx.send(bytes.slice(1..));
                    }
                    CHANNEL_CLOSE if bytes.get(1) == Some(&CHANNEL_STDIN) => stdin_tx = None,
                    _ => {}
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
    });
    let options = session.options;
    let (output_tx, mut output) = mpsc::unbounded_channel();
    let io = ProcessIo {
        stdin: options.stdin.then_some(stdin),
        resize: options.tty.then_some(resize),
        output: output_tx,
    };
    let pump = async {
        while let Some((to, bytes)) = output.recv().await {
            let channel = match (to, options.stderr) {
                (Output::Stderr, true) => CHANNEL_STDERR,
                _ => CHANNEL_STDOUT,
            };
            if sink.send(channel_message(channel, &bytes)).await.is_err() {
                break;
            }
        }
    };
    let (code, ()) = tokio::join!(run_process(&session.kind, &session.target, options.tty, io), pump);
    let status = match protocol {
        "v4.channel.k8s.io" | "v5.channel.k8s.io" => exit_status_json(code),
        _ if code != 0 => format!("command terminated with non-zero exit code: exit status {code}"),
        _ => String::new(),
    };
    let _ = sink.send(channel_message(CHANNEL_ERROR, status.as_bytes())).await;
    let _ = sink.send(Message::Close(None)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
}

async fn websocket_port_forward<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    socket: WebSocketStream<IO>,
    session: &Session,
) {
    let (mut sink, mut incoming) = socket.split();
    // As the kubelet: data channel 2i and error channel 2i+1 for the i-th port, each first announcing the
    // port (little-endian) before anything else.
    for (i, port) in session.ports.iter().enumerate() {
        let (data, error) = (2 * i as u8, 2 * i as u8 + 1);
        let banner = format!("{}:{port}\n", session.target);
        let mut first = port.to_le_bytes().to_vec();
        first.extend_from_slice(banner.as_bytes());
        if sink.send(channel_message(data, &first)).await.is_err()
            || sink
                .send(channel_message(error, &port.to_le_bytes()))
                .await
                .is_err()
        {
            return;
        }
    }
    while let Some(Ok(message)) = incoming.next().await {
        let bytes = match message {
            Message::Binary(bytes) => bytes,
            Message::Close(_) => break,
            _ => continue,
        };
        // Data channels (even) echo; nothing is expected on error channels.
        let data = bytes.len() > 1 && usize::from(bytes[0]) < 2 * session.ports.len() && bytes[0] % 2 == 0;
        if data && sink.send(channel_message(bytes[0], &bytes[1..])).await.is_err() {
            break;
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in data {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn the_dictionary_is_the_spdy3_one() {
        // Length and Adler-32 (the id zlib puts in the stream header) of the dictionary Go's spdystream
        // uses; a different dictionary makes every header block unreadable to kubectl.
        assert_eq!(SPDY3_DICTIONARY.len(), 1423);
        assert_eq!(adler32(&SPDY3_DICTIONARY), 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_survive_compression_across_frames() {
        let mut deflater = HeaderDeflater::new().expect("deflater");
        let mut inflater = HeaderInflater::new();
        for round in 0..3 {
            let requestid = round.to_string();
            let block = encode_header_block(&[
                ("streamType", "data"),
                ("port", "8080"),
                ("requestID", &requestid),
            ]);
            let compressed = deflater.deflate(&block).expect("deflate");
            // The first block carries the dictionary id in its zlib header (FDICT).
            if round == 0 {
                assert_eq!(compressed[1] & 0x20, 0x20);
            }
            let headers =
                decode_header_block(&inflater.inflate(&compressed).expect("inflate")).expect("decode");
            assert_eq!(
                headers,
                [
                    ("streamtype".to_owned(), "data".to_owned()),
                    ("port".to_owned(), "8080".to_owned()),
                    ("requestid".to_owned(), requestid),
                ]
            );
        }
        let multi = decode_header_block(&encode_header_block(&[("x", "a\0b")])).expect("decode");
        assert_eq!(multi, [("x".into(), "a".into()), ("x".into(), "b".into())]);
        assert!(decode_header_block(&[0, 0, 0, 2, 0]).is_err());
    }

    /// A client end of SPDY for tests: writes frames as spdystream would.
    struct TestClient<W> {
        io: W,
        deflater: HeaderDeflater,
    }

    impl<W: AsyncWrite + Unpin> TestClient<W> {
        async fn syn_stream(&mut self, id: u32, headers: &[(&str, &str)], fin: bool) {
            let block = self
                .deflater
                .deflate(&encode_header_block(headers))
                .expect("deflate");
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend_from_slice(&0u32.to_be_bytes());
            payload.extend_from_slice(&[0, 0]);
            payload.extend_from_slice(&block);
            let head = control_header(TYPE_SYN_STREAM, if fin { FLAG_FIN } else { 0 }, payload.len());
            self.io.write_all(&head).await.expect("write");
            self.io.write_all(&payload).await.expect("write");
        }

        async fn data(&mut self, id: u32, data: &[u8], fin: bool) {
            let mut head = id.to_be_bytes().to_vec();
            head.extend_from_slice(
                &((u32::from(if fin { FLAG_FIN } else { 0 }) << 24) | data.len() as u32).to_be_bytes(),
            );
            self.io.write_all(&head).await.expect("write");
            self.io.write_all(data).await.expect("write");
        }
    }

    /// Reads frames until the server closes, collecting DATA per stream and noting FINs and replies.
    async fn drain(
        reader: &mut (impl AsyncRead + Unpin),
    ) -> (HashMap<u32, Vec<u8>>, Vec<u32>, Vec<u32>, bool) {
        let mut inflater = HeaderInflater::new();
        let mut data: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut fins = Vec::new();
        let mut replies = Vec::new();
        let mut goaway = false;
        let mut head = [0u8; 8];
        while reader.read_exact(&mut head).await.is_ok() {
            let first = be32(&head[0..4]);
            let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
            let mut payload = vec![0u8; length];
            reader.read_exact(&mut payload).await.expect("payload");
            if first & 0x8000_0000 == 0 {
                data.entry(first).or_default().extend_from_slice(&payload);
                if head[4] & FLAG_FIN != 0 {
                    fins.push(first);
                }
            } else if first & 0xffff == TYPE_SYN_REPLY {
                inflater.inflate(&payload[4..]).expect("reply headers");
                replies.push(be32(&payload[0..4]));
            } else if first & 0xffff == TYPE_GOAWAY {
                goaway = true;
            }
        }
        (data, fins, replies, goaway)
    }

    fn session(kind: Kind, options: StreamOptions) -> Session {
        Session {
            kind,
            target: "ns/pod/c".into(),
            options,
            ports: Vec::new(),
        }
    }

    #[tokio::test]
    async fn spdy_exec_echoes_stdin_and_reports_the_exit_status() {
        let (server, client) = tokio::io::duplex(1 << 16);
        let options = StreamOptions {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let task = tokio::spawn(serve_spdy(
            server,
            "v4.channel.k8s.io",
            session(Kind::Exec(vec!["cat".into()]), options),
        ));
        let (mut read, write) = tokio::io::split(client);
        let mut client = TestClient {
            io: write,
            deflater: HeaderDeflater::new().expect("deflater"),
        };
        client.syn_stream(1, &[("streamType", "error")], false).await;
        client.syn_stream(3, &[("streamType", "stdin")], false).await;
        client.syn_stream(5, &[("streamType", "stdout")], false).await;
        client.syn_stream(7, &[("streamType", "stderr")], false).await;
        client.data(3, b"hello ", false).await;
        client.data(3, b"spdy", true).await;
        let (data, fins, replies, goaway) = drain(&mut read).await;
        task.await.expect("server");
        assert_eq!(replies, [1, 3, 5, 7]);
        assert_eq!(data.get(&5).map(Vec::as_slice), Some(&b"hello spdy"[..]));
        let status: serde_json::Value = serde_json::from_slice(&data[&1]).expect("status");
        assert_eq!(status["status"], "Success");
        assert!(
            fins.contains(&1) && fins.contains(&5) && fins.contains(&7),
            "{fins:?}"
        );
        assert!(goaway);
    }

    #[tokio::test]
    async fn spdy_exec_failures_carry_the_exit_code() {
        let (server, client) = tokio::io::duplex(1 << 16);
        let options = StreamOptions {
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let kind = Kind::Exec(vec!["exit".into(), "3".into()]);
        let task = tokio::spawn(serve_spdy(server, "v4.channel.k8s.io", session(kind, options)));
        let (mut read, write) = tokio::io::split(client);
        let mut client = TestClient {
            io: write,
            deflater: HeaderDeflater::new().expect("deflater"),
        };
        client.syn_stream(1, &[("streamType", "error")], false).await;
        client.syn_stream(3, &[("streamType", "stdout")], false).await;
        client.syn_stream(5, &[("streamType", "stderr")], false).await;
        let (data, _, _, _) = drain(&mut read).await;
        task.await.expect("server");
        let status: serde_json::Value = serde_json::from_slice(&data[&1]).expect("status");
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
    }

    #[tokio::test]
    async fn spdy_port_forward_sends_a_banner_and_echoes() {
        let (server, client) = tokio::io::duplex(1 << 16);
        let mut pf = session(Kind::PortForward, StreamOptions::default());
        pf.target = "ns/pod".into();
        let task = tokio::spawn(serve_spdy(server, SPDY_PORT_FORWARD_PROTOCOL, pf));
        let (mut read, write) = tokio::io::split(client);
        let mut client = TestClient {
            io: write,
            deflater: HeaderDeflater::new().expect("deflater"),
        };
        client
            .syn_stream(
                1,
                &[("streamType", "error"), ("port", "8080"), ("requestID", "0")],
                false,
            )
            .await;
        client.data(1, b"", true).await;
        client
            .syn_stream(
                3,
                &[("streamType", "data"), ("port", "8080"), ("requestID", "0")],
                false,
            )
            .await;
        client.data(3, b"ping", true).await;
        // GOAWAY from the client ends the session.
        let goaway = control_header(TYPE_GOAWAY, 0, 8);
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.io.write_all(&goaway).await.expect("write");
        client.io.write_all(&[0; 8]).await.expect("write");
        let (data, fins, _, _) = drain(&mut read).await;
        task.await.expect("server");
        assert_eq!(data.get(&3).map(Vec::as_slice), Some(&b"ns/pod:8080\nping"[..]));
        assert!(fins.contains(&1) && fins.contains(&3), "{fins:?}");
    }

    #[tokio::test]
    async fn websocket_exec_uses_channels() {
        let (server, client) = tokio::io::duplex(1 << 16);
        let options = StreamOptions {
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let kind = Kind::Exec(vec!["stderr".into(), "oops".into()]);
        let task = tokio::spawn(async move {
            let socket = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
            serve_websocket(socket, "v5.channel.k8s.io", session(kind, options)).await;
        });
        let mut client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let mut messages = Vec::new();
        while let Some(Ok(message)) = client.next().await {
            if let Message::Binary(bytes) = message {
                messages.push((bytes[0], String::from_utf8_lossy(&bytes[1..]).into_owned()));
            }
        }
        task.await.expect("server");
        assert_eq!(messages[0], (CHANNEL_STDERR, "oops\n".to_owned()));
        assert_eq!(messages[1].0, CHANNEL_ERROR);
        assert!(messages[1].1.contains("Success"), "{messages:?}");
    }
}
