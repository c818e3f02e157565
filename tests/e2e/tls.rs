//! Listening over TLS (`tls.cert_file`, `tls.key_file`), HTTP/1.1 and h2 by ALPN.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{Proxy, ProxyOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mock_upstream::{MockUpstream, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_serves_http1_and_h2() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();

    let mock = MockUpstream::replying(Reply::chat_text("over tls")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!(
                "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
                cert.display().to_string(),
                key.display().to_string()
            ),
            ..ProxyOptions::default()
        },
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();

    for http2 in [false, true] {
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_only();
        // The ALPN offer decides the protocol: h1 only, or h2 only.
        let connector = if http2 {
            builder.enable_http2().build()
        } else {
            builder.enable_http1().build()
        };
        let mut builder = Client::builder(TokioExecutor::new());
        builder.http2_only(http2);
        let client: Client<_, Full<Bytes>> = builder.build(connector);
        let url = format!(
            "https://localhost:{}/v1/chat/completions",
            proxy.addr().port()
        );
        let request = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            )))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.version(),
            if http2 {
                http::Version::HTTP_2
            } else {
                http::Version::HTTP_11
            }
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("over tls"));
    }
    assert_eq!(mock.requests().len(), 2);
}
