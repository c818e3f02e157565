use super::*;

fn upstream(base: &str) -> Upstream {
    let config = UpstreamConfig {
        base_url: base.into(),
        ..UpstreamConfig::default()
    };
    Upstream::new(&config).unwrap()
}

#[test]
fn client_path_and_query_are_appended_to_the_base_path() {
    let up = upstream("http://127.0.0.1:9/proxy/");
    let pq = PathAndQuery::from_static("/v1/models?limit=2");
    assert_eq!(
        up.target(Some(&pq)).unwrap().to_string(),
        "http://127.0.0.1:9/proxy/v1/models?limit=2"
    );
    let plain = upstream("https://api.openai.com");
    assert_eq!(
        plain.target(Some(&pq)).unwrap().to_string(),
        "https://api.openai.com/v1/models?limit=2"
    );
    let slash = upstream("http://127.0.0.1:9/");
    assert_eq!(
        slash.target(Some(&pq)).unwrap().to_string(),
        "http://127.0.0.1:9/v1/models?limit=2"
    );
    assert_eq!(
        slash.target(None).unwrap().to_string(),
        "http://127.0.0.1:9/"
    );
}

#[tokio::test]
async fn errors_never_show_the_credentials_of_the_base_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let up = upstream(&format!("http://user:sk-in-url-secret@127.0.0.1:{port}"));
    let request = Request::builder()
        .uri(up.target(None).unwrap())
        .body(crate::body::full(""))
        .unwrap();
    let err = up.send(request).await.unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(
        !shown.contains("sk-in-url-secret") && !shown.contains("user:"),
        "{shown}"
    );
}

/// What the test upstream saw: the connections it accepted, and each request's
/// version, `Host` and request target.
#[derive(Default)]
struct Seen {
    connections: std::sync::atomic::AtomicUsize,
    requests: std::sync::Mutex<Vec<(http::Version, Option<String>, String)>>,
}

impl Seen {
    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<(http::Version, Option<String>, String)> {
        self.requests.lock().unwrap().clone()
    }
}

/// How the test upstream serves.
#[derive(Clone, Copy, PartialEq)]
enum Serving {
    /// HTTP/1.1 with keep-alive, or h2 when TLS's ALPN picks it.
    KeepAlive,
    /// HTTP/1.1, each connection closed after its one response.
    Close,
    /// Each request answered only once `n` requests are in flight.
    Together(usize),
}

/// An upstream on a loopback port, over TLS (offering `alpn`) when `tls` is given.
async fn serve(
    serving: Serving,
    tls: Option<(rustls::ServerConfig, Vec<Vec<u8>>)>,
) -> (std::net::SocketAddr, Arc<Seen>) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let acceptor = tls.map(|(mut config, alpn)| {
        config.alpn_protocols = alpn;
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let barrier = match serving {
        Serving::Together(n) => Some(Arc::new(tokio::sync::Barrier::new(n))),
        _ => None,
    };
    let served = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            served
                .connections
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (seen, barrier, acceptor) =
                (Arc::clone(&served), barrier.clone(), acceptor.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (seen, barrier) = (Arc::clone(&seen), barrier.clone());
                    async move {
                        let host = request
                            .headers()
                            .get(http::header::HOST)
                            .map(|value| value.to_str().unwrap().to_owned());
                        seen.requests.lock().unwrap().push((
                            request.version(),
                            host,
                            request.uri().to_string(),
                        ));
                        if let Some(barrier) = barrier {
                            barrier.wait().await;
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(crate::body::full("ok")))
                    }
                });
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder.http1().keep_alive(serving != Serving::Close);
                let _ = match acceptor {
                    Some(acceptor) => {
                        let stream = acceptor.accept(stream).await.unwrap();
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    None => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
            });
        }
    });
    (addr, seen)
}

/// An upstream at `base` whose HTTPS trusts `root` alone.
fn trusting(base: &str, root: rustls::pki_types::CertificateDer<'static>) -> Upstream {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).unwrap();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let config = UpstreamConfig {
        base_url: base.into(),
        ..UpstreamConfig::default()
    };
    Upstream::build(
        &config,
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls),
    )
    .unwrap()
}

/// A certificate for `localhost`, and the server's side of it.
fn certified() -> (
    rustls::pki_types::CertificateDer<'static>,
    rustls::ServerConfig,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    (cert, server)
}

/// Sends a GET of `path` and reads the answer whole.
async fn get(up: &Upstream, path: &'static str) -> (http::StatusCode, Bytes) {
    use http_body_util::BodyExt;
    let request = Request::builder()
        .uri(up.target(Some(&PathAndQuery::from_static(path))).unwrap())
        .body(crate::body::full(""))
        .unwrap();
    let response = up.send(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

use bytes::Bytes;

#[tokio::test]
async fn sequential_requests_share_one_connection_in_origin_form_with_the_upstreams_host() {
    let (addr, seen) = serve(Serving::KeepAlive, None).await;
    let up = upstream(&format!("http://{addr}"));
    for _ in 0..3 {
        assert_eq!(
            get(&up, "/v1/models?limit=2").await,
            (http::StatusCode::OK, Bytes::from("ok"))
        );
    }
    assert_eq!(seen.connections(), 1);
    let host = format!("{addr}");
    assert_eq!(
        seen.requests(),
        vec![
            (
                http::Version::HTTP_11,
                Some(host),
                "/v1/models?limit=2".to_owned()
            );
            3
        ]
    );
}

#[tokio::test]
async fn requests_in_flight_together_each_get_a_connection_which_is_reused_after() {
    let (addr, seen) = serve(Serving::Together(2), None).await;
    let up = upstream(&format!("http://{addr}"));
    let opened = together(&up, &seen).await;
    assert_eq!(opened, 2, "HTTP/1.1 carries one request at a time");
    let reused = together(&up, &seen).await;
    assert_eq!(reused, 2, "both connections were idle again, and reused");
}

/// Sends two requests at once; the connections the upstream then had accepted.
async fn together(up: &Upstream, seen: &Seen) -> usize {
    let (first, second) = tokio::join!(get(up, "/a"), get(up, "/b"));
    assert_eq!(
        (first.0, second.0),
        (http::StatusCode::OK, http::StatusCode::OK)
    );
    seen.connections()
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_taken_again() {
    let (addr, seen) = serve(Serving::Close, None).await;
    let up = upstream(&format!("http://{addr}"));
    assert_eq!(one_by_one(&up, &seen, 3).await, 3);
}

#[tokio::test]
async fn a_connection_idle_past_the_timeout_is_closed_not_reused() {
    let (addr, seen) = serve(Serving::KeepAlive, None).await;
    let mut up = upstream(&format!("http://{addr}"));
    up.pools = Arc::from(vec![Pool::new(Duration::ZERO)]);
    assert_eq!(one_by_one(&up, &seen, 2).await, 2);
}

/// Sends `count` requests one after another, a little apart; the connections the
/// upstream then had accepted.
async fn one_by_one(up: &Upstream, seen: &Seen, count: usize) -> usize {
    for _ in 0..count {
        assert_eq!(get(up, "/x").await.0, http::StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen.connections()
}

#[tokio::test]
async fn https_that_picks_h2_carries_requests_in_flight_together_on_one_connection() {
    let (root, server) = certified();
    let alpn = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let (addr, seen) = serve(Serving::Together(2), Some((server, alpn))).await;
    let up = trusting(&format!("https://localhost:{}", addr.port()), root);
    // Before any connection is open, neither request knows the upstream speaks h2:
    // each may open one, as hyper-util's pool did too; the pool keeps one of them.
    let (first, second) = tokio::join!(get(&up, "/a"), get(&up, "/b"));
    assert_eq!(first, (http::StatusCode::OK, Bytes::from("ok")));
    assert_eq!(second.0, http::StatusCode::OK);
    let opened = seen.connections();
    // Four in flight at once: HTTP/1.1 would need four connections, h2 needs the one.
    let answers =
        futures_util::future::join_all(["/c", "/d", "/e", "/f"].map(|path| get(&up, path))).await;
    assert!(answers
        .iter()
        .all(|(status, _)| *status == http::StatusCode::OK));
    assert_eq!(
        seen.connections(),
        opened,
        "no connection opened for the four"
    );
    let authority = format!("https://localhost:{}", addr.port());
    let shown: Vec<_> = seen
        .requests()
        .into_iter()
        .map(|(version, _, target)| (version, target))
        .collect();
    for path in ["/a", "/f"] {
        let sent = (http::Version::HTTP_2, format!("{authority}{path}"));
        assert!(shown.contains(&sent), "{shown:?}");
    }
}

#[tokio::test]
async fn https_that_picks_http1_is_sent_in_origin_form() {
    let (root, server) = certified();
    let (addr, seen) = serve(
        Serving::KeepAlive,
        Some((server, vec![b"http/1.1".to_vec()])),
    )
    .await;
    let up = trusting(&format!("https://localhost:{}", addr.port()), root);
    assert_eq!(get(&up, "/a").await.0, http::StatusCode::OK);
    assert_eq!(get(&up, "/b").await.0, http::StatusCode::OK);
    assert_eq!(seen.connections(), 1);
    let host = format!("localhost:{}", addr.port());
    assert_eq!(
        seen.requests(),
        vec![
            (http::Version::HTTP_11, Some(host.clone()), "/a".to_owned()),
            (http::Version::HTTP_11, Some(host), "/b".to_owned()),
        ]
    );
}
